#include "skip_rms_norm.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "block_offsets.h"
#include "row_math.h"

namespace ortops {

using namespace ortapi;

const InputSpec SkipRMSNorm::kInputs[] = {
    {kFloat, false}, {kFloat, true}, {kFloat, false}, {kFloat, true}, {kFloat16, true},
};
const OutputSpec SkipRMSNorm::kOutputs[] = {{kFloat, false}, {kFloat, false}};

namespace {
struct RowTag;
constexpr int64_t kRowsPerTask = 16;
}  // namespace

SkipRMSNorm::SkipRMSNorm(const KernelInfo& info) : epsilon_(info.Float("epsilon", 1e-5f)) {
  Require(std::isfinite(epsilon_) && epsilon_ >= 0.0f, "epsilon must be finite and >= 0");
}

void SkipRMSNorm::Compute(KernelCall& call) {
  Tensor input = call.Input(0), skip = call.Input(1), gamma = call.Input(2);
  RequireTensor(input, "input", kFloat, 2);
  RequireTensor(gamma, "gamma", kFloat, 1);
  const int64_t rows = input.dim(0), n = input.dim(1);
  Require(gamma.dim(0) == n, "gamma " + gamma.ShapeText() + " must have the input's " + std::to_string(n) +
                                 " columns");
  if (skip.present()) {
    RequireTensor(skip, "skip", kFloat, 2);
    Require(skip.shape == input.shape, "skip " + skip.ShapeText() + " must have input's shape " + input.ShapeText());
  }
  BlockOffsets offsets(call, 3, rows, n);
  Tensor output = call.Output(0, input.shape), sum = call.Output(1, input.shape);
  const RowMath& math = SelectRowMath();
  const float* x = input.as<float>();
  const float* residual = skip.present() ? skip.as<float>() : nullptr;
  const float* weight = gamma.as<float>();
  float* normed = output.as<float>();
  float* total = sum.as<float>();
  const float eps = epsilon_;
  auto task = [&](size_t t) {
    const int64_t begin = static_cast<int64_t>(t) * kRowsPerTask, end = std::min(rows, begin + kRowsPerTask);
    float* row = offsets.present() ? ThreadScratch<RowTag>(static_cast<size_t>(n)) : nullptr;
    for (int64_t r = begin; r < end; ++r)
      math.rms_norm(offsets.Corrected(r, x + r * n, row), residual ? residual + r * n : nullptr, weight, n, eps,
                    normed + r * n, total + r * n);
  };
  call.ParallelFor(static_cast<size_t>((rows + kRowsPerTask - 1) / kRowsPerTask), task);
}

}  // namespace ortops
