#include "packed_causal_conv.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace ortops {

using namespace ortapi;

const InputSpec PackedCausalConv::kInputs[] = {
    {kFloat, false}, {kFloat, false}, {kFloat, true}, {kFloat, false}, {kInt32, false}};
const OutputSpec PackedCausalConv::kOutputs[] = {{kFloat, false}, {kFloat, false}};

PackedCausalConv::PackedCausalConv(const KernelInfo& info) {
  const int64_t silu = info.Int("silu", 0);
  Require(silu == 0 || silu == 1, "silu must be 0 or 1, got " + std::to_string(silu));
  silu_ = silu == 1;
}

namespace {

struct SequenceTag;
constexpr int64_t kChannelsPerTask = 16;

}  // namespace

void PackedCausalConv::Compute(KernelCall& call) {
  Tensor input = call.Input(0), weight = call.Input(1), bias = call.Input(2), past = call.Input(3);
  Tensor cu = call.Input(4);
  RequireTensor(input, "input", kFloat, 3);
  RequireTensor(weight, "weight", kFloat, 3);
  RequireTensor(past, "past_state", kFloat, 3);
  RequireTensor(cu, "cumulative_sequence_lengths", kInt32, 1);
  const int64_t channels = input.dim(1), tokens = input.dim(2), taps = weight.dim(2), rows = past.dim(0);
  Require(input.dim(0) == 1, "input " + input.ShapeText() + " must be [1, channels, num_tokens]");
  Require(weight.dim(0) == channels && weight.dim(1) == 1 && taps >= 1,
          "weight " + weight.ShapeText() + " must be [" + std::to_string(channels) + ", 1, kernel_size]");
  Require(past.dim(1) == channels && past.dim(2) == taps - 1,
          "past_state " + past.ShapeText() + " must be [batch_size, " + std::to_string(channels) + ", " +
              std::to_string(taps - 1) + "]");
  if (bias.present()) {
    RequireTensor(bias, "bias", kFloat, 1);
    Require(bias.dim(0) == channels, "bias " + bias.ShapeText() + " must have " + std::to_string(channels) + " entries");
  }
  Require(cu.dim(0) == rows + 1, "cumulative_sequence_lengths " + cu.ShapeText() + " must have batch_size + 1 (" +
                                     std::to_string(rows + 1) + ") entries");
  const int32_t* starts = cu.as<int32_t>();
  Require(rows == 0 || starts[0] == 0, "cumulative_sequence_lengths must start at 0");
  Require(starts[rows] == tokens, "cumulative_sequence_lengths must end at num_tokens (" + std::to_string(tokens) +
                                      "), got " + std::to_string(starts[rows]));
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    Require(starts[r + 1] >= starts[r], "cumulative_sequence_lengths must not decrease (row " + std::to_string(r) + ")");
    longest = std::max<int64_t>(longest, starts[r + 1] - starts[r]);
  }
  Tensor output = call.Output(0, input.shape);
  Tensor present = call.Output(1, past.shape);
  const float* x = input.as<float>();
  const float* w = weight.as<float>();
  const float* b = bias.present() ? bias.as<float>() : nullptr;
  const float* state_in = past.as<float>();
  float* y = output.as<float>();
  float* state_out = present.as<float>();
  const int64_t state = taps - 1;
  const bool silu = silu_;
  auto task = [&](size_t t) {
    const int64_t c_begin = static_cast<int64_t>(t) * kChannelsPerTask;
    const int64_t c_end = std::min(channels, c_begin + kChannelsPerTask);
    float* sequence = ThreadScratch<SequenceTag>(static_cast<size_t>(state + longest));
    for (int64_t c = c_begin; c < c_end; ++c) {
      const float* kernel = w + c * taps;
      const float offset = b ? b[c] : 0.0f;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t first = starts[r], count = starts[r + 1] - starts[r];
        const int64_t state_at = (r * channels + c) * state;
        std::copy(state_in + state_at, state_in + state_at + state, sequence);
        std::copy(x + c * tokens + first, x + c * tokens + first + count, sequence + state);
        for (int64_t j = 0; j < count; ++j) {
          float sum = offset;
          for (int64_t k = 0; k < taps; ++k) sum += kernel[k] * sequence[j + k];
          y[c * tokens + first + j] = silu ? sum / (1.0f + std::exp(-sum)) : sum;
        }
        std::copy(sequence + count, sequence + count + state, state_out + state_at);
      }
    }
  };
  call.ParallelFor(static_cast<size_t>((channels + kChannelsPerTask - 1) / kChannelsPerTask), task);
}

}  // namespace ortops
