#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "sampling/first_max.h"
#include "base/random_stream.h"

namespace oga {

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1Fu;
  uint32_t mantissa = half & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// The first index at or after `from` whose value equals `value`, or `count`.
size_t FindFirst(const float* data, size_t from, size_t count, float value) {
  size_t i = from;
#if defined(__SSE2__)
  const __m128 target = _mm_set1_ps(value);
  for (; i + 4 <= count; i += 4) {
    const int hits = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(data + i), target));
    if (hits != 0) return i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(hits)));
  }
#endif
  for (; i < count; ++i) {
    if (data[i] == value) return i;
  }
  return count;
}

template <typename Load>
int32_t ArgMax(size_t vocab_size, const std::vector<int32_t>& eos_ids, bool mask_eos, Load load) {
  int32_t best = -1;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t v = 0; v < vocab_size; ++v) {
    const float value = load(v);
    if (!(value > best_value) && !(best < 0 && value == best_value)) continue;  // NaN never wins
    if (mask_eos && std::find(eos_ids.begin(), eos_ids.end(), static_cast<int32_t>(v)) != eos_ids.end()) continue;
    best = static_cast<int32_t>(v);
    best_value = value;
  }
  return best;
}

}  // namespace

int32_t SelectGreedy(const LogitsRow& row, size_t vocab_size, const std::vector<int32_t>& eos_ids, bool mask_eos) {
  if (row.type == OgaExtLogitsType_Float16) {
    const auto* data = static_cast<const uint16_t*>(row.data);
    return ArgMax(vocab_size, eos_ids, mask_eos, [data](size_t v) { return HalfToFloat(data[v]); });
  }
  const auto* data = static_cast<const float*>(row.data);
  // The largest value's first occurrence (one pass), then, when that is a masked EOS id, its next
  // occurrences.
  const FirstMaxResult best =
      row.block_maxima != nullptr ? FirstMaxOfBlocks(data, vocab_size, row.block_maxima) : FirstMax(data, vocab_size);
  if (best.value > kNegativeInfinity) {
    for (size_t v = best.index; v < vocab_size; v = FindFirst(data, v + 1, vocab_size, best.value)) {
      if (!mask_eos || std::find(eos_ids.begin(), eos_ids.end(), static_cast<int32_t>(v)) == eos_ids.end()) {
        return static_cast<int32_t>(v);
      }
    }
  }
  // Every candidate is -inf or NaN, or the maximum is a masked EOS id: the exact scan.
  return ArgMax(vocab_size, eos_ids, mask_eos, [data](size_t v) { return data[v]; });
}

}  // namespace oga

namespace oga {

void LoadLogits(const LogitsRow& row, size_t vocab_size, float* out) {
  if (row.type == OgaExtLogitsType_Float16) {
    const auto* data = static_cast<const uint16_t*>(row.data);
    for (size_t v = 0; v < vocab_size; ++v) out[v] = HalfToFloat(data[v]);
  } else {
    std::memcpy(out, row.data, vocab_size * sizeof(float));
  }
}

void ProcessLogits(const std::vector<int32_t>& sequence, const std::vector<int32_t>& eos_ids, bool mask_eos,
                   const SamplingParams& params, SamplingScratch& scratch) {
  const float repetition_penalty = params.repetition_penalty;
  const int32_t no_repeat_ngram_size = params.no_repeat_ngram_size;
  const float masked = -std::numeric_limits<float>::infinity();
  std::vector<float>& logits = scratch.logits;
  const size_t vocab = logits.size();
  if (mask_eos) {
    for (int32_t eos : eos_ids) logits[static_cast<size_t>(eos)] = masked;
  }
  if (repetition_penalty != 1.0f) {
    for (int32_t token : sequence) {
      const size_t t = static_cast<size_t>(token);
      if (t >= vocab || scratch.seen[t]) continue;
      scratch.seen[t] = 1;
      logits[t] = logits[t] > 0 ? logits[t] / repetition_penalty : logits[t] * repetition_penalty;
    }
    for (int32_t token : sequence) {
      if (static_cast<size_t>(token) < vocab) scratch.seen[static_cast<size_t>(token)] = 0;
    }
  }
  const size_t n = static_cast<size_t>(no_repeat_ngram_size);
  if (n > 0 && sequence.size() + 1 >= n) {
    // The next token completes an n-gram whose first n - 1 tokens are the sequence's suffix.
    const size_t length = sequence.size();
    const size_t prefix = n - 1;
    for (size_t start = 0; start + n <= length; ++start) {
      bool same = true;
      for (size_t j = 0; j < prefix && same; ++j) same = sequence[start + j] == sequence[length - prefix + j];
      if (same) logits[static_cast<size_t>(sequence[start + prefix])] = masked;
    }
  }
}

int32_t ArgMaxProcessed(const SamplingScratch& scratch) {
  const float* logits = scratch.logits.data();
  const size_t count = scratch.logits.size();
  const FirstMaxResult best = FirstMax(logits, count);
  return best.value > kNegativeInfinity ? static_cast<int32_t>(best.index) : -1;
}

namespace {

// e^x for x <= 0 in float: x = n ln 2 + r with |r| <= ln 2 / 2 (n rounded with the 1.5 * 2^23
// trick), a degree-6 Taylor polynomial for e^r (relative error below 2e-7) and 2^n through the
// exponent bits; below -87 it returns about e^-87. The SSE2 version computes the same operations four
// lanes at a time.
constexpr float kLog2E = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
constexpr float kRoundMagic = 12582912.0f;

inline float ExpNonPositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = (x * kLog2E + kRoundMagic) - kRoundMagic;
  const float r = x - n * kLn2;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// Log-probability bucket of each of tokens [begin, begin + 4 * lanes) as uint32 in `out`: the
// truncated (max_logit - logit) * scale, capped at kBuckets - 1 (-inf and NaN logits land there).
inline void BucketsOf(const float* logits, size_t begin, size_t count, float max_logit, float scale,
                      uint32_t* out) {
  constexpr float kLast = static_cast<float>(SamplingScratch::kBuckets - 1);
  size_t v = begin;
#if defined(__SSE2__)
  const __m128 maximum = _mm_set1_ps(max_logit), factor = _mm_set1_ps(scale), last = _mm_set1_ps(kLast);
  for (; v + 4 <= begin + count; v += 4) {
    const __m128 distance = _mm_mul_ps(_mm_sub_ps(maximum, _mm_loadu_ps(logits + v)), factor);
    // MINPS returns its second operand when the first is NaN: NaN and +inf distances cap at kLast.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (v - begin)), _mm_cvttps_epi32(_mm_min_ps(distance, last)));
  }
#endif
  for (; v < begin + count; ++v) {
    const float distance = (max_logit - logits[v]) * scale;
    out[v - begin] = distance < kLast ? static_cast<uint32_t>(distance) : static_cast<uint32_t>(kLast);
  }
}

// weight[v] = e^((logit[v] - max_logit) / temperature), 0 for -inf and NaN logits. The weights of
// each block of kWeightBlock tokens are summed in float lanes and the block sums kept in double
// (block_mass), so the draw can skip whole blocks; returns the total.
constexpr size_t kWeightBlock = 64;
// Log-probability buckets per unit of (max_logit - logit) / temperature: each bucket spans a
// probability ratio of e^(1/kBucketsPerNat), about 2%.
constexpr float kBucketsPerNat = 46.0f;

double Weigh(const float* logits, size_t count, float max_logit, float inverse_temperature, float* weight,
             double* block_mass) {
  double total = 0.0;
  for (size_t begin = 0; begin < count; begin += kWeightBlock) {
    const size_t end = std::min(count, begin + kWeightBlock);
    size_t v = begin;
    float block = 0.0f;
#if defined(__SSE2__)
    const __m128 maximum = _mm_set1_ps(max_logit), inverse = _mm_set1_ps(inverse_temperature);
    const __m128 floor = _mm_set1_ps(-87.0f), log2e = _mm_set1_ps(kLog2E), magic = _mm_set1_ps(kRoundMagic);
    const __m128 ln2 = _mm_set1_ps(kLn2), negative_infinity = _mm_set1_ps(kNegativeInfinity);
    __m128 sum = _mm_setzero_ps();
    for (; v + 4 <= end; v += 4) {
      const __m128 logit = _mm_loadu_ps(logits + v);
      __m128 x = _mm_mul_ps(_mm_sub_ps(logit, maximum), inverse);
      x = _mm_max_ps(x, floor);  // NaN lanes become the floor; they are zeroed below
      const __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, log2e), magic), magic);
      const __m128 r = _mm_sub_ps(x, _mm_mul_ps(n, ln2));
      __m128 p = _mm_set1_ps(1.0f / 720.0f);
      p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 120.0f));
      p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 24.0f));
      p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 6.0f));
      p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(0.5f));
      p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
      p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
      const __m128i exponent = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n), _mm_set1_epi32(127)), 23);
      __m128 w = _mm_mul_ps(p, _mm_castsi128_ps(exponent));
      w = _mm_and_ps(w, _mm_cmpgt_ps(logit, negative_infinity));
      _mm_storeu_ps(weight + v, w);
      sum = _mm_add_ps(sum, w);
    }
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, sum);
    block = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
    for (; v < end; ++v) {
      const float logit = logits[v];
      weight[v] = logit > kNegativeInfinity ? ExpNonPositive((logit - max_logit) * inverse_temperature) : 0.0f;
      block += weight[v];
    }
    block_mass[begin / kWeightBlock] = block;
    total += block;
  }
  return total;
}

// Draws a token with probability proportional to weight[v] (total `mass`) in index order: whole
// blocks are skipped by their sums. -1 when every weight is 0.
int32_t DrawWeighted(const float* weight, const double* block_mass, size_t count, double mass, RandomStream& stream) {
  double remaining = stream.Uniform() * mass;
  int32_t last = -1;
  for (size_t begin = 0; begin < count; begin += kWeightBlock) {
    const double block = block_mass[begin / kWeightBlock];
    if (block == 0.0) continue;
    const size_t end = std::min(count, begin + kWeightBlock);
    if (remaining >= block) {
      remaining -= block;
      for (size_t v = end; v > begin; --v) {
        if (weight[v - 1] != 0.0f) {
          last = static_cast<int32_t>(v - 1);
          break;
        }
      }
      continue;
    }
    for (size_t v = begin; v < end; ++v) {
      if (weight[v] == 0.0f) continue;
      last = static_cast<int32_t>(v);
      remaining -= weight[v];
      if (remaining < 0) return last;
    }
  }
  return last;  // rounding left a sliver of mass: the last candidate
}

// Sampling over the whole vocabulary without sorting it (a flat distribution over a large
// vocabulary is the slow case of top-p). Weights come from one pass. For a nucleus, tokens are
// bucketed by log-probability (each bucket spans a probability ratio of about 2%): the buckets above
// the one the nucleus ends in are taken whole, and only that boundary bucket is sorted, so the
// nucleus is exactly the smallest prefix of the (logit descending, index ascending) order whose
// mass reaches top_p, as a full sort would give. The draw then walks the nucleus in index order
// (every path walks its candidates in index order, as the device sampler does, so one Philox draw
// picks the same token on both): a token belongs to it when its logit is above the last one taken
// from the boundary bucket, or equal to it at a lower or equal index.
int32_t SampleDense(float temperature, float top_p, RandomStream& stream, SamplingScratch& scratch) {
  const float* logits = scratch.logits.data();
  const size_t vocab = scratch.logits.size();
  float* weight = scratch.weights.data();
  const float inverse_temperature = 1.0f / temperature;
  const float max_logit = BlockMax(logits, vocab);
  if (!(max_logit > kNegativeInfinity)) return -1;
  const bool nucleus = top_p > 0.0f && top_p < 1.0f;
  if (!nucleus) {
    const double total = Weigh(logits, vocab, max_logit, inverse_temperature, weight, scratch.block_mass.data());
    return DrawWeighted(weight, scratch.block_mass.data(), vocab, total, stream);
  }
  const size_t buckets = SamplingScratch::kBuckets;
  const float scale = inverse_temperature * kBucketsPerNat;
  uint32_t lanes[64];
  double* even = scratch.bucket_mass.data();
  double* odd = even + buckets;
  const double total = Weigh(logits, vocab, max_logit, inverse_temperature, weight, scratch.block_mass.data());
  // Two interleaved histograms, so neighbouring tokens in one bucket do not wait on each other.
  std::fill(scratch.bucket_mass.begin(), scratch.bucket_mass.end(), 0.0);
  for (size_t begin = 0; begin < vocab; begin += 64) {
    const size_t n = std::min<size_t>(64, vocab - begin);
    BucketsOf(logits, begin, n, max_logit, scale, lanes);
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
      even[lanes[i]] += weight[begin + i];
      odd[lanes[i + 1]] += weight[begin + i + 1];
    }
    if (i < n) even[lanes[i]] += weight[begin + i];
  }
  const double target = static_cast<double>(top_p) * total;
  size_t boundary = 0;
  double above = 0.0;
  while (boundary + 1 < buckets && above + even[boundary] + odd[boundary] < target) {
    above += even[boundary] + odd[boundary];
    ++boundary;
  }
  // The members of a bucket, in index order (zero-weight tokens, -inf and NaN, never belong).
  auto members = [&](size_t bucket, int32_t* out) {
    size_t count = 0;
    size_t v = 0;
#if defined(__SSE2__)
    const __m128 maximum = _mm_set1_ps(max_logit), factor = _mm_set1_ps(scale);
    const __m128 last = _mm_set1_ps(static_cast<float>(buckets - 1));
    const __m128i wanted = _mm_set1_epi32(static_cast<int32_t>(bucket));
    for (; v + 4 <= vocab; v += 4) {
      const __m128 distance = _mm_mul_ps(_mm_sub_ps(maximum, _mm_loadu_ps(logits + v)), factor);
      const __m128i ids = _mm_cvttps_epi32(_mm_min_ps(distance, last));
      int hits = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(ids, wanted)));
      while (hits != 0) {
        const size_t token = v + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(hits)));
        hits &= hits - 1;
        if (weight[token] != 0.0f) out[count++] = static_cast<int32_t>(token);
      }
    }
#endif
    for (; v < vocab; v += 64) {
      const size_t n = std::min<size_t>(64, vocab - v);
      BucketsOf(logits, v, n, max_logit, scale, lanes);
      for (size_t i = 0; i < n; ++i) {
        if (lanes[i] == bucket && weight[v + i] != 0.0f) out[count++] = static_cast<int32_t>(v + i);
      }
    }
    return count;
  };
  int32_t* edge = scratch.spare_order.data();
  const size_t edge_count = members(boundary, edge);
  std::sort(edge, edge + edge_count, [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  double mass = above;
  size_t taken = 0;
  while (taken < edge_count && mass < target) mass += weight[edge[taken++]];
  if (taken == 0) {
    // Only possible when rounding left the boundary bucket's mass short: the top token alone. The
    // draw is still consumed, so a sampled token always advances the stream by one, as the device
    // sampler's does (the engine publishes counter + 1 for every row the device samples).
    stream.Uniform();
    return static_cast<int32_t>(FindFirst(logits, 0, vocab, max_logit));
  }
  const int32_t last_taken = edge[taken - 1];
  const float threshold = logits[last_taken];
  double remaining = stream.Uniform() * mass;
  int32_t last = last_taken;
  const double* block_mass = scratch.block_mass.data();
  for (size_t begin = 0; begin < vocab; begin += kWeightBlock) {
    if (block_mass[begin / kWeightBlock] == 0.0) continue;  // nothing there can belong to the nucleus
    const size_t end = std::min(vocab, begin + kWeightBlock);
    for (size_t v = begin; v < end; ++v) {
      const float logit = logits[v];
      if (weight[v] == 0.0f || !(logit > threshold || (logit == threshold && static_cast<int32_t>(v) <= last_taken))) {
        continue;
      }
      last = static_cast<int32_t>(v);
      remaining -= weight[v];
      if (remaining < 0) return last;
    }
  }
  return last;  // rounding left a sliver of mass: the last member
}

// Sampling over a top-k candidate list without a nucleus: weights and one draw in index order.
int32_t SampleCandidates(int32_t* order, size_t count, float temperature, RandomStream& stream,
                         SamplingScratch& scratch) {
  std::sort(order, order + count);  // index order, as the device sampler walks
  const float* logits = scratch.logits.data();
  float* weight = scratch.weights.data();
  const float inverse_temperature = 1.0f / temperature;
  float max_logit = kNegativeInfinity;
  for (size_t i = 0; i < count; ++i) max_logit = std::max(max_logit, logits[order[i]]);
  double mass = 0.0;
  for (size_t i = 0; i < count; ++i) {
    weight[i] = ExpNonPositive((logits[order[i]] - max_logit) * inverse_temperature);
    mass += weight[i];
  }
  double remaining = stream.Uniform() * mass;
  for (size_t i = 0; i < count; ++i) {
    remaining -= weight[i];
    if (remaining < 0) return order[i];
  }
  return order[count - 1];
}

}  // namespace

int32_t SampleProcessed(const SamplingParams& params, RandomStream& stream, SamplingScratch& scratch) {
  const float temperature = params.temperature;
  const int32_t top_k = params.top_k;
  const float top_p = params.top_p;
  const std::vector<float>& logits = scratch.logits;
  if (top_k <= 0 || static_cast<size_t>(top_k) >= logits.size()) {
    // No top-k cut: every token is a candidate (weights of masked ones are 0).
    return SampleDense(temperature, top_p, stream, scratch);
  }
  // The top_k largest in one pass against a bounded heap whose front is the worst kept candidate.
  // Tokens arrive in index order, so a later token equal to the front loses the tie: only strictly
  // larger logits enter, and the test runs four lanes at a time.
  int32_t* order = scratch.order.data();
  const float* values = logits.data();
  const size_t vocab = logits.size();
  auto before = [values](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  };
  const size_t k = static_cast<size_t>(top_k);
  size_t kept = 0;
  size_t v = 0;
  for (; v < vocab && kept < k; ++v) {
    if (values[v] > kNegativeInfinity) order[kept++] = static_cast<int32_t>(v);
  }
  if (kept == 0) return -1;
  std::make_heap(order, order + kept, before);
  auto offer = [&](size_t token) {
    if (!(values[token] > values[order[0]])) return;
    std::pop_heap(order, order + kept, before);
    order[kept - 1] = static_cast<int32_t>(token);
    std::push_heap(order, order + kept, before);
  };
#if defined(__SSE2__)
  for (; v + 4 <= vocab; v += 4) {
    if (_mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(values + v), _mm_set1_ps(values[order[0]]))) == 0) continue;
    for (size_t j = v; j < v + 4; ++j) offer(j);
  }
#endif
  for (; v < vocab; ++v) offer(v);
  const bool nucleus = top_p > 0.0f && top_p < 1.0f;
  if (!nucleus) return SampleCandidates(order, kept, temperature, stream, scratch);
  // A nucleus among the top_k: sort them, weigh them in double precision, cut, draw.
  std::sort(order, order + kept, before);
  const double inverse_temperature = 1.0 / static_cast<double>(temperature);
  const double max_logit = static_cast<double>(logits[order[0]]);
  double total = 0.0;
  double* probability = scratch.probabilities.data();
  for (size_t i = 0; i < kept; ++i) {
    probability[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) * inverse_temperature);
    total += probability[i];
  }
  double cumulative = 0.0;
  size_t cut = 0;
  const double target = static_cast<double>(top_p) * total;
  while (cut < kept && cumulative < target) cumulative += probability[cut++];
  kept = std::max<size_t>(cut, 1);
  total = cumulative > 0 ? cumulative : probability[0];
  // The nucleus in index order, as the device sampler walks it (the weights do not depend on order).
  std::sort(order, order + kept);
  double draw = stream.Uniform() * total;
  for (size_t i = 0; i < kept; ++i) {
    draw -= std::exp((static_cast<double>(logits[order[i]]) - max_logit) * inverse_temperature);
    if (draw < 0) return order[i];
  }
  return order[kept - 1];
}

void ApplyAllowedMask(const uint32_t* allowed, SamplingScratch& scratch) {
  float* logits = scratch.logits.data();
  const size_t vocab = scratch.logits.size();
  for (size_t word = 0; word * 32 < vocab; ++word) {
    const uint32_t bits = allowed[word];
    if (bits == UINT32_MAX) continue;
    const size_t end = std::min(vocab, word * 32 + 32);
    for (size_t t = word * 32; t < end; ++t) {
      if (((bits >> (t - word * 32)) & 1u) == 0) logits[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace oga
