#include "row_math.h"

#include "half.h"
#include "library_state.h"

#include <cmath>

namespace ortops {

namespace {

void RmsNorm(const float* x, const float* residual, const float* weight, int64_t n, float eps, float* normed,
             float* sum) {
  double squares = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = residual ? x[i] + residual[i] : x[i];
    squares += static_cast<double>(v) * v;
  }
  const float inv = 1.0f / std::sqrt(static_cast<float>(squares / n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    const float v = residual ? x[i] + residual[i] : x[i];
    if (sum) sum[i] = v;
    normed[i] = v * inv * weight[i];
  }
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void AddBlockOffsets(const float* x, int64_t k, const uint16_t* C, int64_t n, float* y) {
  for (int64_t b = 0; b < k / kOffsetBlock; ++b) {
    float s = 0.0f;
    for (int64_t i = 0; i < kOffsetBlock; ++i) s += x[b * kOffsetBlock + i];
    const uint16_t* row = C + b * n;
    for (int64_t j = 0; j < n; ++j) y[j] += s * HalfToFloat(row[j]);
  }
}

}  // namespace

const RowMath kPortableRowMath = {RmsNorm, SwiGlu, AddBlockOffsets, "portable"};

const RowMath& SelectRowMath() {
  static const RowMath* vector = CpuHasAvx2FmaF16c() ? Avx2RowMath() : nullptr;
  return vector != nullptr && !PortableForced() ? *vector : kPortableRowMath;
}

}  // namespace ortops
