/*
 * skip_rms_norm.h -- oga.SkipRMSNorm: residual add and RMSNorm in one pass over each row, with the
 * block offsets of the linear that produced the input (block_offsets.h).
 *
 *   0 input           float [rows, n]   (a linear's output)
 *   1 skip            float [rows, n]   (optional: the residual stream)
 *   2 gamma           float [n]
 *   3 offset_input    float [rows, k]   (optional, with 4)
 *   4 offset_weights  float16 [k/32, n] (optional, with 3)
 *
 *   0 output          float [rows, n]   RMSNorm(sum) * gamma
 *   1 sum             float [rows, n]   sum = input (+ offsets) (+ skip): the next residual
 *
 * Attribute: epsilon (default 1e-5). The same as com.microsoft.SkipSimplifiedLayerNormalization
 * when the offsets are absent.
 */
#ifndef OGA_ORTOPS_SKIP_RMS_NORM_H_
#define OGA_ORTOPS_SKIP_RMS_NORM_H_

#include "op_kernel.h"

namespace ortops {

class SkipRMSNorm {
 public:
  static constexpr const char* kName = "SkipRMSNorm";
  static const InputSpec kInputs[];
  static constexpr size_t kNumInputs = 5;
  static const OutputSpec kOutputs[];
  static constexpr size_t kNumOutputs = 2;

  explicit SkipRMSNorm(const KernelInfo& info);
  void Compute(KernelCall& call);

 private:
  float epsilon_;
};

}  // namespace ortops

#endif  // OGA_ORTOPS_SKIP_RMS_NORM_H_
