// The AVX2/FMA/F16C loops of row_math.h, reached through SelectRowMath() after a CPU check.
#include "row_math.h"

#include "half.h"
#include "simd_avx2.h"

#if defined(__x86_64__) || defined(_M_X64)

namespace ortops {

namespace {

OGA_AVX2 void RmsNorm(const float* x, const float* residual, const float* weight, int64_t n, float eps, float* normed,
                      float* sum) {
  __m256 squares = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
    squares = _mm256_fmadd_ps(v, v, squares);
  }
  float total = HorizontalSum(squares);
  for (int64_t t = i; t < n; ++t) {
    const float v = residual ? x[t] + residual[t] : x[t];
    total += v * v;
  }
  const float inv = 1.0f / __builtin_sqrtf(total / static_cast<float>(n) + eps);
  const __m256 scale = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
    if (sum) _mm256_storeu_ps(sum + i, v);
    _mm256_storeu_ps(normed + i, _mm256_mul_ps(_mm256_mul_ps(v, scale), _mm256_loadu_ps(weight + i)));
  }
  for (; i < n; ++i) {
    const float v = residual ? x[i] + residual[i] : x[i];
    if (sum) sum[i] = v;
    normed[i] = v * inv * weight[i];
  }
}

OGA_AVX2 void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, Exp(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + __builtin_expf(-gate[i])) * up[i];
}

OGA_AVX2 void AddBlockOffsets(const float* x, int64_t k, const uint16_t* C, int64_t n, float* y) {
  const int64_t blocks = k / kOffsetBlock;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kOffsetBlock;
    const __m256 s4 = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                    _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
    const float s = HorizontalSum(s4);
    const __m256 sv = _mm256_set1_ps(s);
    const uint16_t* row = C + b * n;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 c = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j)));
      _mm256_storeu_ps(y + j, _mm256_fmadd_ps(sv, c, _mm256_loadu_ps(y + j)));
    }
    for (; j < n; ++j) y[j] += s * HalfToFloat(row[j]);
  }
}

const RowMath kAvx2RowMath = {RmsNorm, SwiGlu, AddBlockOffsets, "avx2"};

}  // namespace

const RowMath* Avx2RowMath() { return &kAvx2RowMath; }

}  // namespace ortops

#else

namespace ortops {
const RowMath* Avx2RowMath() { return nullptr; }
}  // namespace ortops

#endif
