// Batched token selection over device logits: one thread block per row, no scratch memory.
//
// A row is greedy when its temperature is not above 0 or its top_k is 1 (the engine's TurnPolicy
// makes such turns greedy): the largest logit wins, the lowest index on ties, NaN never; -1 when
// every logit is -inf or NaN (the host then falls back, as the CPU engine does). Greedy rows draw
// nothing, so their counter is written back unchanged.
//
// A sampled row follows the CPU sampler (src/sampling/sampler.cpp):
//   candidates  every logit above -inf (NaN never is one);
//   top_k       when 0 < top_k < vocab: the top_k largest, ties going to the lower index;
//   top_p       when 0 < top_p < 1: the smallest prefix of the kept candidates in (logit descending,
//               index ascending) order whose softmax mass reaches top_p of theirs;
//   draw        u = Philox draw `counter` of stream `seed` (philox.cuh); the kept candidates are
//               walked in index order and the first whose cumulative weight exceeds u times their
//               total is chosen; the row's next counter is counter + 1.
// Weights are e^((logit - max) / temperature) (exactly 1 for the maximum, so a +inf logit is
// simply certain), held as unsigned 64-bit fixed point with 42 fractional bits. Integer sums do not
// depend on the order atomics land in, so a row's choice is deterministic run to run, and the walk
// always ends inside the mass it was drawn from. A weight below 2^-42 of the maximum's counts as 0
// (at most vocab * 2^-42 of the mass: 4e-8 of it for a 150k vocabulary). The CPU sampler sums
// float weights in another order, so the two can disagree only where the drawn point or the top_p
// target lies within float rounding of a boundary between two candidates' cumulative masses; the
// kernel tests accept a token the exact-arithmetic reference gives for a point and a target within
// a relative 1e-5 of the true ones (tests/kernel_reference.py).
//
// top_k and top_p need no sort: the threshold is found by a most-significant-digit radix select
// over order-preserving 32-bit keys (8 bits a pass, four passes over the row), counting candidates
// for top_k and summing their weights for top_p; ties at the threshold are settled in index order
// by one more pass. A kept set is always "key above T, or key equal to T and index at most L".
//
// Launch: grid (rows) or fewer blocks (a block loops over rows), block a multiple of 32 up to 1024
// (1024 is best for large vocabularies), no dynamic shared memory.
#include "device_support.cuh"
#include "philox.cuh"

#define OGA_WEIGHT_SCALE 4398046511104.0f  // 2^42: one unit is the smallest weight that counts

struct OgaSelectShared {
  unsigned long long histogram[256];
  unsigned long long warp_total[32];
  float warp_value[32];
  int warp_index[32];
  float max_logit;
  int argmax;
  // Radix select results.
  unsigned int bin;
  unsigned long long need;  // what is still wanted inside the chosen bin (count or mass)
  // Walks.
  int segment;
  unsigned long long segment_rest;
  int found;
};

// The kept set of a row: candidates whose key is above `key`, or equal to it at an index up to
// `last`. key 0 (below every candidate's key, -inf's is 0x007FFFFF) keeps every candidate.
struct OgaKeptSet {
  unsigned int key;
  int last;
};

__device__ __forceinline__ bool oga_is_candidate(float logit) {
  return logit > __uint_as_float(OGA_NEGATIVE_INFINITY_BITS);
}

__device__ __forceinline__ bool oga_in_kept_set(const OgaKeptSet& kept, float logit, int v) {
  if (!oga_is_candidate(logit)) return false;
  const unsigned int key = oga_order_key(logit);
  return key > kept.key || (key == kept.key && v <= kept.last);
}

// The float whose oga_order_key is `key`.
__device__ __forceinline__ float oga_key_value(unsigned int key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

__device__ __forceinline__ unsigned long long oga_weight(float logit, float max_logit, float inverse_temperature) {
  const float w = logit == max_logit ? 1.0f : expf((logit - max_logit) * inverse_temperature);
  return static_cast<unsigned long long>(w * OGA_WEIGHT_SCALE);
}

// The row's largest logit and its lowest index (-1 and -inf when there is no candidate).
template <typename Logit>
__device__ void oga_block_argmax(const Logit* row, int vocab, OgaSelectShared& shared) {
  float best = __uint_as_float(OGA_NEGATIVE_INFINITY_BITS);
  int index = -1;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float x = oga_load_logit(row, v);
    if (x > best) {  // ascending v: a later equal value keeps the lower index
      best = x;
      index = v;
    }
  }
  oga_warp_argmax(best, index);
  if (oga_lane() == 0) {
    shared.warp_value[oga_warp()] = best;
    shared.warp_index[oga_warp()] = index;
  }
  __syncthreads();
  if (oga_warp() == 0) {
    const bool has = oga_lane() < oga_warp_count();
    float value = has ? shared.warp_value[oga_lane()] : __uint_as_float(OGA_NEGATIVE_INFINITY_BITS);
    int at = has ? shared.warp_index[oga_lane()] : -1;
    oga_warp_argmax(value, at);
    if (oga_lane() == 0) {
      shared.max_logit = value;
      shared.argmax = at;
    }
  }
  __syncthreads();
}

// Index-ordered walks split the row into one contiguous segment per warp (a multiple of 32 long),
// which the warp reads 32 consecutive elements at a time.
__device__ __forceinline__ int oga_segment_length(int vocab) {
  const int span = 32 * static_cast<int>(oga_warp_count());
  return (vocab + span - 1) / span * 32;
}

// The index of the n-th (from 1) element of the row for which pred(v) holds, in index order, or
// `vocab` when there are fewer than n.
template <typename Pred>
__device__ int oga_nth_match(int vocab, unsigned long long n, Pred pred, OgaSelectShared& shared) {
  const int length = oga_segment_length(vocab);
  const int begin = static_cast<int>(oga_warp()) * length;
  const int end = begin + length < vocab ? begin + length : vocab;
  unsigned long long count = 0;
  for (int base = begin; base < end; base += 32) {
    const int v = base + static_cast<int>(oga_lane());
    count += __popc(__ballot_sync(OGA_FULL_WARP, v < end && pred(v)));
  }
  if (oga_lane() == 0) shared.warp_total[oga_warp()] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long before = 0;
    shared.segment = -1;
    shared.found = vocab;
    for (unsigned int w = 0; w < oga_warp_count(); ++w) {
      if (before + shared.warp_total[w] >= n) {
        shared.segment = static_cast<int>(w);
        shared.segment_rest = n - before;
        break;
      }
      before += shared.warp_total[w];
    }
  }
  __syncthreads();
  if (static_cast<int>(oga_warp()) == shared.segment) {
    unsigned long long rest = shared.segment_rest;
    for (int base = begin; base < end; base += 32) {
      const int v = base + static_cast<int>(oga_lane());
      unsigned int hits = __ballot_sync(OGA_FULL_WARP, v < end && pred(v));
      const unsigned long long here = __popc(hits);
      if (here >= rest) {
        for (; rest > 1; --rest) hits &= hits - 1;  // drop the lower matches
        if (oga_lane() == 0) shared.found = base + __ffs(static_cast<int>(hits)) - 1;
        break;
      }
      rest -= here;
    }
  }
  __syncthreads();
  return shared.found;
}

// histogram[bin] += amount for every lane with `counted` (all 32 lanes call it together). Logits
// crowd into few bins (the top key byte is the sign and most of the exponent; fp16 logits repeat
// exact values), and lanes adding to one shared-memory address are serialized, so the two most
// common bins among the lanes are first summed across the warp and added by one lane each; the
// rest add their own.
__device__ __forceinline__ void oga_warp_histogram_add(unsigned long long* histogram, bool counted, unsigned int bin,
                                                       unsigned long long amount) {
  unsigned int pending = __ballot_sync(OGA_FULL_WARP, counted);
  for (int round = 0; round < 2 && pending != 0; ++round) {
    const int leader = __ffs(static_cast<int>(pending)) - 1;
    const unsigned int leader_bin = __shfl_sync(OGA_FULL_WARP, bin, leader);
    const bool mine = ((pending >> oga_lane()) & 1u) != 0 && bin == leader_bin;
    const unsigned long long sum = oga_warp_sum(mine ? amount : 0ull);
    if (static_cast<int>(oga_lane()) == leader) atomicAdd(&histogram[leader_bin], sum);
    pending &= ~__ballot_sync(OGA_FULL_WARP, mine);
  }
  if ((pending >> oga_lane()) & 1u) atomicAdd(&histogram[bin], amount);
}

// One most-significant-digit radix select over the keys of the candidates accepted by `accept`,
// each counting `weight` (1 for a count, its fixed-point weight for a mass). The wanted amount is
// need_of(total) (0: no selection needed). On return shared.bin's pass has narrowed the threshold
// to one key, `shared.need` is what remains wanted among the candidates with exactly that key and
// `shared.histogram[shared.bin]` is their total. Returns the threshold key, or 0 when no selection
// was needed.
template <typename Logit, typename Accept, typename Weight, typename NeedOf>
__device__ unsigned int oga_radix_select(const Logit* row, int vocab, Accept accept, Weight weight, NeedOf need_of,
                                         OgaSelectShared& shared) {
  unsigned int prefix = 0, mask = 0;
  unsigned long long need = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) shared.histogram[i] = 0;
    __syncthreads();
    // Whole warps step together (v0 is the warp's first element), so the histogram update can use
    // warp intrinsics.
    for (int v0 = static_cast<int>(threadIdx.x - oga_lane()); v0 < vocab; v0 += blockDim.x) {
      const int v = v0 + static_cast<int>(oga_lane());
      bool counted = false;
      unsigned int bin = 0;
      unsigned long long amount = 0;
      if (v < vocab) {
        const float x = oga_load_logit(row, v);
        if (accept(x, v)) {
          const unsigned int key = oga_order_key(x);
          counted = (key & mask) == prefix;
          bin = (key >> shift) & 0xFFu;
          amount = counted ? weight(x) : 0ull;
        }
      }
      oga_warp_histogram_add(shared.histogram, counted, bin, amount);
    }
    __syncthreads();
    if (oga_warp() == 0) {
      // Lane l holds bins 255 - 8l down to 248 - 8l: lane order is descending key order.
      const unsigned int lane = oga_lane();
      unsigned long long sum = 0;
      for (int j = 0; j < 8; ++j) sum += shared.histogram[255 - 8 * lane - j];
      const unsigned long long inclusive = oga_warp_inclusive_scan(sum);
      const unsigned long long group_total = __shfl_sync(OGA_FULL_WARP, inclusive, 31);
      if (shift == 24) need = need_of(group_total);
      const unsigned long long exclusive = inclusive - sum;
      if (need > 0 && exclusive < need && need <= inclusive) {
        unsigned long long before = exclusive;
        for (int j = 0; j < 8; ++j) {
          const unsigned int bin = 255 - 8 * lane - j;
          const unsigned long long here = shared.histogram[bin];
          if (before + here >= need) {
            shared.bin = bin;
            shared.need = need - before;
            break;
          }
          before += here;
        }
      }
      if (shift == 24 && need == 0 && lane == 0) shared.need = 0;
    }
    __syncthreads();
    if (shared.need == 0) return 0;
    // Only warp 0 read the histogram, before the barrier above, so the next pass may clear it; the
    // values read here are rewritten only after two more barriers.
    need = shared.need;
    prefix |= shared.bin << shift;
    mask |= 0xFFu << shift;
  }
  return prefix;
}

template <typename Logit>
__device__ int oga_sample_row(const Logit* row, int vocab, float temperature, int top_k, float top_p,
                              unsigned long long seed, unsigned long long counter, OgaSelectShared& shared) {
  const float max_logit = shared.max_logit;
  const float inverse_temperature = 1.0f / temperature;
  auto weight = [=](float x) { return oga_weight(x, max_logit, inverse_temperature); };
  auto is_candidate = [](float x, int) { return oga_is_candidate(x); };
  OgaKeptSet kept = {0u, vocab};

  if (top_k > 0 && top_k < vocab) {
    auto one = [](float) { return 1ull; };
    const unsigned long long k = static_cast<unsigned long long>(top_k);
    auto need_of = [k](unsigned long long candidates) { return candidates > k ? k : 0ull; };
    const unsigned int key = oga_radix_select(row, vocab, is_candidate, one, need_of, shared);
    if (key != 0) {
      kept.key = key;
      const unsigned long long ties = shared.histogram[shared.bin];
      const unsigned long long wanted = shared.need;
      __syncthreads();  // everyone has read the histogram before top_p's passes clear it
      if (wanted < ties) {
        kept.last = oga_nth_match(
            vocab, wanted,
            [&](int v) {
              const float x = oga_load_logit(row, v);
              return oga_is_candidate(x) && oga_order_key(x) == key;
            },
            shared);
      }
    }
  }

  if (top_p > 0.0f && top_p < 1.0f) {
    const OgaKeptSet top = kept;
    auto in_top = [=](float x, int v) { return oga_in_kept_set(top, x, v); };
    const double fraction = static_cast<double>(top_p);
    auto need_of = [fraction](unsigned long long mass) {
      // The smallest integer mass reaching top_p of the total (at least 1 unit, at most all).
      unsigned long long target = static_cast<unsigned long long>(ceil(fraction * static_cast<double>(mass)));
      if (target < 1) target = 1;
      return target > mass ? mass : target;
    };
    const unsigned int key = oga_radix_select(row, vocab, in_top, weight, need_of, shared);
    // key 0 only when the mass is 0, which the maximum (weight 2^42) rules out.
    const unsigned long long tie_weight = weight(oga_key_value(key));
    const unsigned long long tie_mass = shared.histogram[shared.bin];
    const unsigned long long wanted = (shared.need + tie_weight - 1) / tie_weight;  // ties needed
    __syncthreads();  // as above (nothing below writes these today; the next row's passes do)
    kept.key = key;
    kept.last = top.last;
    if (wanted < tie_mass / tie_weight) {
      kept.last = oga_nth_match(
          vocab, wanted,
          [&](int v) {
            const float x = oga_load_logit(row, v);
            return oga_in_kept_set(top, x, v) && oga_order_key(x) == key;
          },
          shared);
    } else if (key != top.key) {
      kept.last = vocab;  // every tie at a key above top_k's threshold is a top_k candidate
    }
  }

  // The draw: segment masses, then the one warp whose segment holds the drawn point walks it.
  const int length = oga_segment_length(vocab);
  const int begin = static_cast<int>(oga_warp()) * length;
  const int end = begin + length < vocab ? begin + length : vocab;
  unsigned long long mass = 0;
  for (int v = begin + static_cast<int>(oga_lane()); v < end; v += 32) {
    const float x = oga_load_logit(row, v);
    if (oga_in_kept_set(kept, x, v)) mass += weight(x);
  }
  mass = oga_warp_sum(mass);
  if (oga_lane() == 0) shared.warp_total[oga_warp()] = mass;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (unsigned int w = 0; w < oga_warp_count(); ++w) total += shared.warp_total[w];
    const double u = oga_philox_uniform(seed, counter);
    unsigned long long point = static_cast<unsigned long long>(u * static_cast<double>(total));
    if (point >= total) point = total - 1;  // the product can round up to the total
    unsigned long long before = 0;
    shared.segment = -1;
    shared.found = -1;
    for (unsigned int w = 0; w < oga_warp_count(); ++w) {
      if (point < before + shared.warp_total[w]) {
        shared.segment = static_cast<int>(w);
        shared.segment_rest = point - before;
        break;
      }
      before += shared.warp_total[w];
    }
  }
  __syncthreads();
  if (static_cast<int>(oga_warp()) == shared.segment) {
    const unsigned long long rest = shared.segment_rest;
    unsigned long long running = 0;
    for (int base = begin; base < end; base += 32) {
      const int v = base + static_cast<int>(oga_lane());
      unsigned long long w = 0;
      if (v < end) {
        const float x = oga_load_logit(row, v);
        if (oga_in_kept_set(kept, x, v)) w = weight(x);
      }
      const unsigned long long inclusive = oga_warp_inclusive_scan(w);
      const unsigned int past = __ballot_sync(OGA_FULL_WARP, running + inclusive > rest);
      if (past != 0) {
        if (oga_lane() == 0) shared.found = base + __ffs(static_cast<int>(past)) - 1;
        break;
      }
      running += __shfl_sync(OGA_FULL_WARP, inclusive, 31);
    }
  }
  __syncthreads();
  return shared.found;
}

template <typename Logit>
__device__ void oga_sample_rows(const Logit* logits, long long row_stride, int vocab_size, int num_rows,
                                const int* logits_rows, const float* temperatures, const int* top_ks,
                                const float* top_ps, const unsigned long long* seeds,
                                const unsigned long long* counters, int* tokens, unsigned long long* next_counters) {
  __shared__ OgaSelectShared shared;
  for (int r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const long long source = logits_rows != nullptr ? logits_rows[r] : r;
    const Logit* row = logits + source * row_stride;
    const float temperature = temperatures[r];
    const int top_k = top_ks[r];
    oga_block_argmax(row, vocab_size, shared);
    const bool greedy = !(temperature > 0.0f) || top_k == 1;
    int token = shared.argmax;
    const bool draws = !greedy && token >= 0;
    if (draws) token = oga_sample_row(row, vocab_size, temperature, top_k, top_ps[r], seeds[r], counters[r], shared);
    if (threadIdx.x == 0) {
      tokens[r] = token;
      next_counters[r] = counters[r] + (draws ? 1u : 0u);
    }
    __syncthreads();  // the next row reuses the shared state
  }
}

template <typename Logit>
__device__ void oga_argmax_rows(const Logit* logits, long long row_stride, int vocab_size, int num_rows,
                                const int* logits_rows, int* tokens) {
  __shared__ OgaSelectShared shared;
  for (int r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const long long source = logits_rows != nullptr ? logits_rows[r] : r;
    oga_block_argmax(logits + source * row_stride, vocab_size, shared);
    if (threadIdx.x == 0) tokens[r] = shared.argmax;
    __syncthreads();
  }
}

// Greedy selection of every row. `logits_rows` (may be null) maps a batch row to its logits row.
extern "C" __global__ void __launch_bounds__(1024)
    oga_argmax_f32(const float* logits, long long row_stride, int vocab_size, int num_rows, const int* logits_rows,
                   int* tokens) {
  oga_argmax_rows(logits, row_stride, vocab_size, num_rows, logits_rows, tokens);
}

extern "C" __global__ void __launch_bounds__(1024)
    oga_argmax_f16(const unsigned short* logits, long long row_stride, int vocab_size, int num_rows,
                   const int* logits_rows, int* tokens) {
  oga_argmax_rows(logits, row_stride, vocab_size, num_rows, logits_rows, tokens);
}

// Per-row greedy or sampled selection (see the top of the file). next_counters may alias counters.
extern "C" __global__ void __launch_bounds__(1024)
    oga_sample_f32(const float* logits, long long row_stride, int vocab_size, int num_rows, const int* logits_rows,
                   const float* temperatures, const int* top_ks, const float* top_ps, const unsigned long long* seeds,
                   const unsigned long long* counters, int* tokens, unsigned long long* next_counters) {
  oga_sample_rows(logits, row_stride, vocab_size, num_rows, logits_rows, temperatures, top_ks, top_ps, seeds, counters,
                  tokens, next_counters);
}

extern "C" __global__ void __launch_bounds__(1024)
    oga_sample_f16(const unsigned short* logits, long long row_stride, int vocab_size, int num_rows,
                   const int* logits_rows, const float* temperatures, const int* top_ks, const float* top_ps,
                   const unsigned long long* seeds, const unsigned long long* counters, int* tokens,
                   unsigned long long* next_counters) {
  oga_sample_rows(logits, row_stride, vocab_size, num_rows, logits_rows, temperatures, top_ks, top_ps, seeds, counters,
                  tokens, next_counters);
}
