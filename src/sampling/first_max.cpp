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

// Each lane keeps its largest value and the first index holding it: a value replaces the lane's
// only when strictly greater (so NaN never enters, and a later equal value keeps the earlier
// index). The row's answer is the largest lane value and, among the lanes holding it, the
// smallest index: the first occurrence overall.
FirstMaxResult Reduce(const float* values, const int* indices, size_t lanes, FirstMaxResult tail) {
  FirstMaxResult best = tail;
  for (size_t l = 0; l < lanes; ++l) {
    const size_t index = static_cast<size_t>(indices[l]);
    if (values[l] > best.value || (values[l] == best.value && values[l] > kNegativeInfinity && index < best.index))
      best = {index, values[l]};
  }
  return best;
}

FirstMaxResult Scalar(const float* data, size_t begin, size_t count) {
  FirstMaxResult best{count, kNegativeInfinity};
  for (size_t i = begin; i < count; ++i)
    if (data[i] > best.value) best = {i, data[i]};
  return best;
}

#if OGA_FIRST_MAX_X86
__attribute__((target("avx2"))) FirstMaxResult Avx2(const float* data, size_t count) {
  // Two independent accumulators of 8 lanes, 16 values per iteration.
  __m256 max_a = _mm256_set1_ps(kNegativeInfinity), max_b = max_a;
  __m256i index_a = _mm256_set1_epi32(0), index_b = index_a;
  __m256i position_a = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i position_b = _mm256_add_epi32(position_a, _mm256_set1_epi32(8));
  const __m256i step = _mm256_set1_epi32(16);
  size_t i = 0;
  // int32 lane indices: rows beyond 2^31 entries take the scalar loop
  const size_t vector_end = count < (size_t{1} << 31) ? count : 0;
  for (; i + 16 <= vector_end; i += 16) {
    const __m256 a = _mm256_loadu_ps(data + i), b = _mm256_loadu_ps(data + i + 8);
    const __m256 greater_a = _mm256_cmp_ps(a, max_a, _CMP_GT_OQ), greater_b = _mm256_cmp_ps(b, max_b, _CMP_GT_OQ);
    max_a = _mm256_blendv_ps(max_a, a, greater_a);
    max_b = _mm256_blendv_ps(max_b, b, greater_b);
    index_a = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(index_a), _mm256_castsi256_ps(position_a), greater_a));
    index_b = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(index_b), _mm256_castsi256_ps(position_b), greater_b));
    position_a = _mm256_add_epi32(position_a, step);
    position_b = _mm256_add_epi32(position_b, step);
  }
  alignas(32) float values[16];
  alignas(32) int indices[16];
  _mm256_store_ps(values, max_a);
  _mm256_store_ps(values + 8, max_b);
  _mm256_store_si256(reinterpret_cast<__m256i*>(indices), index_a);
  _mm256_store_si256(reinterpret_cast<__m256i*>(indices + 8), index_b);
  FirstMaxResult tail = Scalar(data, i, count);
  FirstMaxResult best = Reduce(values, indices, 16, tail);
  if (best.value == kNegativeInfinity) best.index = count;
  return best;
}

FirstMaxResult Sse2(const float* data, size_t count) {
  __m128 max_a = _mm_set1_ps(kNegativeInfinity), max_b = max_a;
  __m128i index_a = _mm_set1_epi32(0), index_b = index_a;
  __m128i position_a = _mm_setr_epi32(0, 1, 2, 3), position_b = _mm_setr_epi32(4, 5, 6, 7);
  const __m128i step = _mm_set1_epi32(8);
  size_t i = 0;
  const size_t vector_end = count < (size_t{1} << 31) ? count : 0;
  for (; i + 8 <= vector_end; i += 8) {
    const __m128 a = _mm_loadu_ps(data + i), b = _mm_loadu_ps(data + i + 4);
    const __m128 greater_a = _mm_cmpgt_ps(a, max_a), greater_b = _mm_cmpgt_ps(b, max_b);
    max_a = _mm_or_ps(_mm_and_ps(greater_a, a), _mm_andnot_ps(greater_a, max_a));
    max_b = _mm_or_ps(_mm_and_ps(greater_b, b), _mm_andnot_ps(greater_b, max_b));
    const __m128i take_a = _mm_castps_si128(greater_a), take_b = _mm_castps_si128(greater_b);
    index_a = _mm_or_si128(_mm_and_si128(take_a, position_a), _mm_andnot_si128(take_a, index_a));
    index_b = _mm_or_si128(_mm_and_si128(take_b, position_b), _mm_andnot_si128(take_b, index_b));
    position_a = _mm_add_epi32(position_a, step);
    position_b = _mm_add_epi32(position_b, step);
  }
  alignas(16) float values[8];
  alignas(16) int indices[8];
  _mm_store_ps(values, max_a);
  _mm_store_ps(values + 4, max_b);
  _mm_store_si128(reinterpret_cast<__m128i*>(indices), index_a);
  _mm_store_si128(reinterpret_cast<__m128i*>(indices + 4), index_b);
  FirstMaxResult best = Reduce(values, indices, 8, Scalar(data, i, count));
  if (best.value == kNegativeInfinity) best.index = count;
  return best;
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

}  // namespace

FirstMaxResult FirstMax(const float* data, size_t count) {
#if OGA_FIRST_MAX_X86
  return UseAvx2() ? Avx2(data, count) : Sse2(data, count);
#else
  return Scalar(data, 0, count);
#endif
}

}  // namespace oga
