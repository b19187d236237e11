#include "row_math.h"

#include "library_state.h"

#include <cmath>
#include <cstring>

namespace ortops {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int shift = 0;
      uint32_t m = mantissa;
      while ((m & 0x400u) == 0) {
        m <<= 1;
        ++shift;
      }
      bits = sign | static_cast<uint32_t>(127 - 15 - shift + 1) << 23 | (m & 0x3FFu) << 13;
    }
  } else if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

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

bool CpuHasAvx2FmaF16c() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

}  // namespace

const RowMath kPortableRowMath = {RmsNorm, SwiGlu, AddBlockOffsets, "portable"};

const RowMath& SelectRowMath() {
  static const RowMath* vector = CpuHasAvx2FmaF16c() ? Avx2RowMath() : nullptr;
  return vector != nullptr && !PortableForced() ? *vector : kPortableRowMath;
}

}  // namespace ortops
