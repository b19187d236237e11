#include "sampling/first_max.h"

#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define OGA_FIRST_MAX_X86 1
#endif

namespace oga {

namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// The row is read in blocks: a block's maximum takes only max instructions (no index bookkeeping),
// the running maximum moves to a block only when that block's maximum is strictly greater (so the
// first block holding the row's maximum wins), and only the winning block is read again for the
// first index holding its maximum. NaN never wins: MAXPS returns its second operand when either is
// NaN, and the accumulator is that operand. +0 and -0 compare equal, so the first of them wins.
constexpr size_t kBlock = 1024;

float ScalarMax(const float* data, size_t count, float best) {
  for (size_t i = 0; i < count; ++i)
    if (data[i] > best) best = data[i];
  return best;
}

#if OGA_FIRST_MAX_X86
__attribute__((target("avx2"))) float BlockMaxAvx2(const float* data, size_t count) {
  // Four independent accumulators: the loop runs at the loads' rate, not max's latency.
  __m256 a = _mm256_set1_ps(kNegativeInfinity), b = a, c = a, d = a;
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
  return ScalarMax(data + i, count - i, _mm_cvtss_f32(h));
}

float BlockMaxSse2(const float* data, size_t count) {
  __m128 a = _mm_set1_ps(kNegativeInfinity), b = a, c = a, d = a;
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
  return ScalarMax(data + i, count - i, _mm_cvtss_f32(h));
}

// AVX2 where the CPU has it, unless OGA_SAMPLER_PORTABLE=1 asks for the SSE2 loop (the x86-64
// baseline), which tests use to check both; read once.
bool UseAvx2() {
  static const bool use = [] {
    const char* portable = std::getenv("OGA_SAMPLER_PORTABLE");
    return __builtin_cpu_supports("avx2") && !(portable != nullptr && std::strcmp(portable, "1") == 0);
  }();
  return use;
}
#endif

float BlockMax(const float* data, size_t count) {
#if OGA_FIRST_MAX_X86
  return UseAvx2() ? BlockMaxAvx2(data, count) : BlockMaxSse2(data, count);
#else
  return ScalarMax(data, count, kNegativeInfinity);
#endif
}

}  // namespace

FirstMaxResult FirstMax(const float* data, size_t count) {
  float best = kNegativeInfinity;
  size_t best_block = count;
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const float block = BlockMax(data + begin, count - begin < kBlock ? count - begin : kBlock);
    if (block > best) {
      best = block;
      best_block = begin;
    }
  }
  if (best_block == count) return {count, kNegativeInfinity};  // nothing above -inf
  size_t index = best_block;
  while (data[index] != best) ++index;  // present: the block's maximum is one of its values
  return {index, data[index]};
}

}  // namespace oga
