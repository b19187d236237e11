// The largest value of a run of floats, NaN ignored, -inf when none exceeds -inf: the block maxima
// of greedy selection (first_max.cpp) and of the LM head operator that hands them to it
// (ortops/logits_head.h, OgaExtStepOutputs.logits_block_maxima), which must agree. Header-only and
// free of the core, because the core and the operator library are separate binaries.
#pragma once

#include <cstddef>
#include <limits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define OGA_BLOCK_MAX_X86 1
#endif

namespace oga {

// data[0, count) against `best`: `>` is false for NaN, so NaN never wins.
inline float ScalarBlockMax(const float* data, size_t count,
                            float best = -std::numeric_limits<float>::infinity()) {
  for (size_t i = 0; i < count; ++i)
    if (data[i] > best) best = data[i];
  return best;
}

#if OGA_BLOCK_MAX_X86
// MAXPS returns its second operand when either is NaN, and the accumulator is that operand: NaN
// never enters. +0 and -0 compare equal, either may be returned.
__attribute__((target("avx2"))) inline float BlockMaxAvx2(const float* data, size_t count) {
  // Four independent accumulators: the loop runs at the loads' rate, not max's latency.
  __m256 a = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    a = _mm256_max_ps(_mm256_loadu_ps(data + i), a);
    b = _mm256_max_ps(_mm256_loadu_ps(data + i + 8), b);
    c = _mm256_max_ps(_mm256_loadu_ps(data + i + 16), c);
    d = _mm256_max_ps(_mm256_loadu_ps(data + i + 24), d);
  }
  for (; i + 8 <= count; i += 8) a = _mm256_max_ps(_mm256_loadu_ps(data + i), a);
  const __m256 m = _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(c, d));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return ScalarBlockMax(data + i, count - i, _mm_cvtss_f32(h));
}

inline float BlockMaxSse2(const float* data, size_t count) {
  __m128 a = _mm_set1_ps(-std::numeric_limits<float>::infinity()), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    a = _mm_max_ps(_mm_loadu_ps(data + i), a);
    b = _mm_max_ps(_mm_loadu_ps(data + i + 4), b);
    c = _mm_max_ps(_mm_loadu_ps(data + i + 8), c);
    d = _mm_max_ps(_mm_loadu_ps(data + i + 12), d);
  }
  for (; i + 4 <= count; i += 4) a = _mm_max_ps(_mm_loadu_ps(data + i), a);
  __m128 h = _mm_max_ps(_mm_max_ps(a, b), _mm_max_ps(c, d));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return ScalarBlockMax(data + i, count - i, _mm_cvtss_f32(h));
}
#endif

}  // namespace oga
