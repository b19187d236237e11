#include "sampling/first_max.h"

#include <cstdlib>
#include <cstring>
#include <limits>

#include "sampling/block_max.h"

namespace oga {

namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// The row is read in blocks: a block's maximum takes only max instructions (no index bookkeeping),
// the running maximum moves to a block only when that block's maximum is strictly greater (so the
// first block holding the row's maximum wins), and only the winning block is read again for the
// first index holding its maximum. NaN never wins (block_max.h). +0 and -0 compare equal, so the
// first of them wins.
constexpr size_t kBlock = kFirstMaxBlock;

#if OGA_BLOCK_MAX_X86
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

float BlockMax(const float* data, size_t count) {
#if OGA_BLOCK_MAX_X86
  return UseAvx2() ? BlockMaxAvx2(data, count) : BlockMaxSse2(data, count);
#else
  return ScalarBlockMax(data, count);
#endif
}

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

FirstMaxResult FirstMaxOfBlocks(const float* data, size_t count, const float* block_maxima) {
  float best = kNegativeInfinity;
  size_t best_block = count;
  for (size_t b = 0, begin = 0; begin < count; ++b, begin += kBlock) {
    if (block_maxima[b] > best) {  // NaN never wins; the first block holding the maximum does
      best = block_maxima[b];
      best_block = begin;
    }
  }
  if (best_block == count) return {count, kNegativeInfinity};
  const size_t end = count - best_block < kBlock ? count : best_block + kBlock;
  for (size_t index = best_block; index < end; ++index)
    if (data[index] == best) return {index, data[index]};
  return FirstMax(data, count);  // the maxima do not describe this row
}

}  // namespace oga
