/*
 * packed_causal_conv.h -- oga.PackedCausalConv: the causal depthwise convolution of short-convolution
 * layers (LFM2's), over packed rows, each row continuing from its own state.
 *
 *   0 input             float [1, C, N]       channels first, the packed tokens of every row in order
 *   1 weight            float [C, 1, K]       one kernel of K taps per channel
 *   2 bias              float [C]             (optional)
 *   3 past_state        float [B, C, K-1]     each row's last K-1 inputs before this step, oldest first
 *   4 cumulative_sequence_lengths  int32 [B + 1]  row r owns tokens cu[r] .. cu[r+1]-1
 *
 *   0 output            float [1, C, N]
 *   1 present_state     float [B, C, K-1]     each row's last K-1 inputs after this step
 *
 * Attribute: silu (0/1): SiLU applied to each output.
 *
 * Row r's sequence is its state followed by its tokens, s = past_state[r] | input[cu[r] .. cu[r+1]);
 * token j's output is bias + sum_k weight[k] * s[j + k] (the newest input takes the last tap), as
 * com.microsoft.CausalConvWithState computes for one sequence; a row never reads another row's
 * tokens. A row without tokens this step keeps its state. present_state may be bound to the same
 * memory as past_state: a row's state is read before it is written, and rows are independent.
 */
#ifndef OGA_ORTOPS_PACKED_CAUSAL_CONV_H_
#define OGA_ORTOPS_PACKED_CAUSAL_CONV_H_

#include "op_kernel.h"

namespace ortops {

class PackedCausalConv {
 public:
  static constexpr const char* kName = "PackedCausalConv";
  static const InputSpec kInputs[];
  static constexpr size_t kNumInputs = 5;
  static const OutputSpec kOutputs[];
  static constexpr size_t kNumOutputs = 2;

  explicit PackedCausalConv(const KernelInfo& info);
  void Compute(KernelCall& call);

 private:
  bool silu_;
};

}  // namespace ortops

#endif  // OGA_ORTOPS_PACKED_CAUSAL_CONV_H_
