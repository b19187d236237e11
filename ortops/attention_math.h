/*
 * attention_math.h -- the inner loops of paged attention on the CPU, over keys and values read in
 * place from cache blocks: a run of `n` consecutive slots of one block, slot j at
 * k + j * slot_stride, its kv head h at + h * D (query head h reads kv head h / group). The cache
 * holds float or half (IEEE binary16, half.h) values; queries, scores and outputs are float.
 *
 * Two shapes of work:
 * - decode (one query token of a row): every query head against a run, slot by slot. A slot's
 *   heads are contiguous, so the cache is read front to back; scores are kept slot-major
 *   (S[j * s_stride + h]) so the softmax runs across heads in vector lanes. Blocks are wherever the
 *   block table says, which the hardware prefetchers cannot follow, so decode_scores also asks for
 *   the slots of two other runs (a later run's keys, the current run's values) to be brought into
 *   the L2 cache while it works.
 * - prefill tiles (several query tokens of a row): a tile of query rows (tokens x the query heads
 *   of one kv head) against up to 16 slots as a small matrix product (`tile_scores`,
 *   `tile_accumulate`), so every key and value loaded serves every row of the tile.
 *
 * SelectMath() picks the AVX2/FMA/F16C versions when the CPU has them and head_dim is a multiple of
 * 8, the portable ones otherwise; both compute the same sums up to floating-point reassociation.
 */
#ifndef OGA_ORTOPS_ATTENTION_MATH_H_
#define OGA_ORTOPS_ATTENTION_MATH_H_

#include <cstddef>

#include "half.h"

namespace ortops {

constexpr int kTileKeys = 16;  // slots per tile_scores / tile_accumulate call (at most)

// Slot-major score rows are padded to a multiple of this many heads.
constexpr int kHeadLanes = 8;
inline int PaddedHeads(int heads) { return (heads + kHeadLanes - 1) / kHeadLanes * kHeadLanes; }

// The loops that touch the cache, for caches of element type T (float or Half).
template <typename T>
struct CacheMath {
  //   S[j * s_stride + h] = dot(q + h * D, slot j's kv head h / group)   for j < n, h < heads;
  // lanes heads .. PaddedHeads(heads)-1 of each S row are written too (with 0). Prefetches slot j
  // of ahead0 / ahead1 (either may be NULL) into L2 while reading slot j.
  void (*decode_scores)(const float* q, int heads, int group, const T* k, size_t slot_stride, int n, int D,
                        float* S, size_t s_stride, const T* ahead0, const T* ahead1);
  //   o[h * D + d] += sum_{j < n} S[j * s_stride + h] * slot j's kv head h / group [d]   for h < heads.
  void (*decode_accumulate)(const float* S, size_t s_stride, int heads, int group, const T* v, size_t slot_stride,
                            int n, int D, float* o);
  // S[r * s_stride + j] = dot(Q[r * D ...], k + j * stride) for r < rows, j < n <= kTileKeys.
  // Columns n .. kTileKeys-1 of each S row may be overwritten. `pack` holds D * kTileKeys floats.
  void (*tile_scores)(const float* Q, int rows, const T* k, size_t stride, int n, int D, float* S, size_t s_stride,
                      float* pack);
  // O[r * D + d] += sum_{j < n} P[r * p_stride + j] * v[j * stride + d], for r < rows, d < D.
  void (*tile_accumulate)(const float* P, size_t p_stride, int rows, const T* v, size_t stride, int n, int D,
                          float* O);
  // out[d] = x[d] for d < D, converted to T (half: rounded to nearest even).
  void (*store)(const float* x, int D, T* out);
};

struct AttentionMath {
  CacheMath<float> float_cache;
  CacheMath<Half> half_cache;
  //   S[j * s_stride + h] = exp(S[j * s_stride + h] - maxes[h]), maxes[h] = max_j S[j * s_stride + h],
  //   sums[h] = sum_j of the new values, for j < n and h < columns (a multiple of kHeadLanes).
  void (*softmax_columns)(float* S, int n, size_t s_stride, int columns, float* maxes, float* sums);
  // x[i] = exp(x[i] - shift) for i < n; returns their sum.
  float (*exp_shifted_sum)(float* x, int n, float shift);
  const char* name;

  const CacheMath<float>& cache(const float*) const { return float_cache; }
  const CacheMath<Half>& cache(const Half*) const { return half_cache; }
};

const AttentionMath& SelectMath(int head_dim);

// The portable implementation (also the reference the vector one is tested against).
extern const AttentionMath kPortableMath;
// The AVX2/FMA/F16C implementation, or NULL when this build has none (not an x86-64 compiler).
const AttentionMath* Avx2Math();

}  // namespace ortops

#endif  // OGA_ORTOPS_ATTENTION_MATH_H_
