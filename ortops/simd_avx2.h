// simd_avx2.h -- AVX2/FMA helpers shared by the vector loops (*_avx2.cpp). Every function carries
// the target attribute, so only code that SelectMath / SelectRowMath reached after checking the
// CPU ever runs them.
#ifndef OGA_ORTOPS_SIMD_AVX2_H_
#define OGA_ORTOPS_SIMD_AVX2_H_

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#define OGA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace ortops {
namespace {

OGA_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// [sum(a0), sum(a1), ..., sum(a7)]
OGA_AVX2 inline __m256 TransposedSums(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                                      __m256 a7) {
  __m256 t0 = _mm256_hadd_ps(a0, a1);
  __m256 t1 = _mm256_hadd_ps(a2, a3);
  __m256 t2 = _mm256_hadd_ps(a4, a5);
  __m256 t3 = _mm256_hadd_ps(a6, a7);
  __m256 u0 = _mm256_hadd_ps(t0, t1);  // [a0..a3 low halves | a0..a3 high halves]
  __m256 u1 = _mm256_hadd_ps(t2, t3);  // [a4..a7 low halves | a4..a7 high halves]
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// exp(x) for x <= ~88: 2^n * e^r with |r| <= ln2/2 and a degree-6 Taylor polynomial (relative
// error below 2e-7); results below 2^-126 are flushed towards the smallest normal.
OGA_AVX2 inline __m256 Exp(__m256 x) {
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 ln2_hi = _mm256_set1_ps(0.693359375f);
  const __m256 ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, ln2_hi, x);
  r = _mm256_fnmadd_ps(n, ln2_lo, r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace
}  // namespace ortops

#endif
#endif  // OGA_ORTOPS_SIMD_AVX2_H_
