/*
 * swiglu.h -- oga.SwiGlu: the gated activation of Llama's MLP, SiLU(gate) * up, from the fused
 * gate|up projection, with that projection's block offsets (block_offsets.h).
 *
 *   0 gate_up         float [rows, 2I]  (gate in columns 0..I-1, up in I..2I-1)
 *   1 offset_input    float [rows, k]   (optional, with 2)
 *   2 offset_weights  float16 [k/32, 2I] (optional, with 1)
 *
 *   0 output          float [rows, I]
 */
#ifndef OGA_ORTOPS_SWIGLU_H_
#define OGA_ORTOPS_SWIGLU_H_

#include "op_kernel.h"

namespace ortops {

class SwiGlu {
 public:
  static constexpr const char* kName = "SwiGlu";
  static const InputSpec kInputs[];
  static constexpr size_t kNumInputs = 3;
  static const OutputSpec kOutputs[];
  static constexpr size_t kNumOutputs = 1;

  explicit SwiGlu(const KernelInfo&) {}
  void Compute(KernelCall& call);
};

}  // namespace ortops

#endif  // OGA_ORTOPS_SWIGLU_H_
