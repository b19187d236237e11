#include "logits_head.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "library_state.h"
#include "sampling/block_max.h"

namespace ortops {

using namespace ortapi;

const InputSpec LogitsHead::kInputs[] = {{kFloat, false}, {kFloat, false}};
const OutputSpec LogitsHead::kOutputs[] = {{kFloat, false}, {kFloat, true}};

namespace {

// Panel p, column j, hidden index k of the packed weight.
inline size_t PackedIndex(int64_t p, int64_t hidden, int64_t k, int64_t j) {
  return (static_cast<size_t>(p) * static_cast<size_t>(hidden) + static_cast<size_t>(k)) * kPanel +
         static_cast<size_t>(j);
}

// One sum per logit over the packed panel, k ascending: the same order as the vector loops' lanes.
void PortablePanels(const float* x, int64_t rows, int64_t hidden, const float* packed, int64_t p0, int64_t p1,
                    int64_t vocab, float* y) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t columns = std::min<int64_t>(kPanel, vocab - p * kPanel);
    for (int64_t r = 0; r < rows; ++r) {
      float sums[kPanel] = {};
      const float* xr = x + r * hidden;
      for (int64_t k = 0; k < hidden; ++k) {
        const float* w = packed + PackedIndex(p, hidden, k, 0);
        for (int64_t j = 0; j < kPanel; ++j) sums[j] += xr[k] * w[j];
      }
      std::memcpy(y + r * vocab + p * kPanel, sums, static_cast<size_t>(columns) * sizeof(float));
    }
  }
}

float BlockMax(const float* data, int64_t count) { return oga::ScalarBlockMax(data, static_cast<size_t>(count)); }

}  // namespace

const LogitsHeadMath kPortableLogitsHeadMath = {PortablePanels, BlockMax, "portable"};

const LogitsHeadMath& SelectLogitsHeadMath() {
  static const LogitsHeadMath* vector = CpuHasAvx2FmaF16c() ? Avx2LogitsHeadMath() : nullptr;
  return vector != nullptr && !PortableForced() ? *vector : kPortableLogitsHeadMath;
}

LogitsHead::LogitsHead(const KernelInfo& info) {
  const Tensor weight = info.ConstantInput(1);
  Require(weight.present(), "weight must be a constant initializer (it is packed once, when the session is created)");
  RequireTensor(weight, "weight", kFloat, 2);
  vocab_ = weight.dim(0);
  hidden_ = weight.dim(1);
  Require(vocab_ > 0 && hidden_ > 0, "weight " + weight.ShapeText() + " must have vocab and hidden sizes above 0");
  const int64_t panels = (vocab_ + kPanel - 1) / kPanel;
  // 64-byte alignment: a panel row (kPanel floats) is one cache line.
  const size_t bytes = static_cast<size_t>(panels) * static_cast<size_t>(hidden_) * kPanel * sizeof(float);
  float* packed = static_cast<float*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  if (packed == nullptr) throw std::bad_alloc();
  packed_.reset(packed);
  const float* w = weight.as<float>();
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t columns = std::min<int64_t>(kPanel, vocab_ - p * kPanel);
    for (int64_t k = 0; k < hidden_; ++k) {
      float* out = packed + PackedIndex(p, hidden_, k, 0);
      for (int64_t j = 0; j < columns; ++j) out[j] = w[(p * kPanel + j) * hidden_ + k];
      for (int64_t j = columns; j < kPanel; ++j) out[j] = 0.0f;
    }
  }
}

void LogitsHead::Compute(KernelCall& call) {
  const Tensor x = call.Input(0);
  RequireTensor(x, "x", kFloat, 2);
  Require(x.dim(1) == hidden_, "x " + x.ShapeText() + " must have " + std::to_string(hidden_) +
                                    " columns (the weight's hidden size)");
  const int64_t rows = x.dim(0), vocab = vocab_, hidden = hidden_;
  const int64_t blocks = (vocab + kLogitsBlock - 1) / kLogitsBlock;
  Tensor logits = call.Output(0, {rows, vocab});
  Tensor maxima = call.OptionalOutput(1, {rows, blocks});
  if (rows == 0) return;
  const LogitsHeadMath& math = SelectLogitsHeadMath();
  const float* in = x.as<float>();
  const float* packed = packed_.get();
  float* y = logits.as<float>();
  float* block_maxima = maxima.as<float>();  // NULL when the node leaves the output out
  // One task per block of logits: its panels, then (while its rows x kLogitsBlock logits are still
  // in cache) each row's maximum of the block.
  call.ParallelFor(static_cast<size_t>(blocks), [&](size_t b) {
    const int64_t begin = static_cast<int64_t>(b) * kLogitsBlock;
    const int64_t end = std::min(vocab, begin + kLogitsBlock);
    math.panels(in, rows, hidden, packed, begin / kPanel, (end + kPanel - 1) / kPanel, vocab, y);
    if (block_maxima == nullptr) return;
    for (int64_t r = 0; r < rows; ++r)
      block_maxima[r * blocks + static_cast<int64_t>(b)] = math.block_max(y + r * vocab + begin, end - begin);
  });
}

}  // namespace ortops
