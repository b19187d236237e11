#include "sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "random_stream.h"

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
  return ArgMax(vocab_size, eos_ids, mask_eos, [data](size_t v) { return data[v]; });
}

}  // namespace oga

namespace oga {

void LoadLogits(const LogitsRow& row, size_t vocab_size, SamplingScratch& scratch) {
  float* out = scratch.logits.data();
  if (row.type == OgaExtLogitsType_Float16) {
    const auto* data = static_cast<const uint16_t*>(row.data);
    for (size_t v = 0; v < vocab_size; ++v) out[v] = HalfToFloat(data[v]);
  } else {
    std::memcpy(out, row.data, vocab_size * sizeof(float));
  }
}

void ProcessLogits(const std::vector<int32_t>& sequence, const std::vector<int32_t>& eos_ids, bool mask_eos,
                   float repetition_penalty, int32_t no_repeat_ngram_size, SamplingScratch& scratch) {
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
  int32_t best = -1;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t v = 0; v < scratch.logits.size(); ++v) {
    if (scratch.logits[v] > best_value) {
      best = static_cast<int32_t>(v);
      best_value = scratch.logits[v];
    }
  }
  return best;
}

namespace {

// Rearranges candidates [begin, end) of scratch.order / scratch.probabilities so that the first
// returned count of them are the highest-logit candidates whose probabilities add up to `needed`
// (ties broken by `before`, as a full sort would). Candidates in buckets above the one the nucleus
// ends in are taken whole; only that boundary bucket is sorted.
template <typename Before>
size_t ExtendNucleus(size_t begin, size_t end, double needed, const std::vector<float>& logits, Before before,
                     double max_logit, double inverse_temperature, SamplingScratch& scratch, double& added) {
  int32_t* order = scratch.order.data();
  double* probability = scratch.probabilities.data();
  const size_t buckets = SamplingScratch::kBuckets;
  float high = -std::numeric_limits<float>::infinity();
  float low = std::numeric_limits<float>::infinity();
  for (size_t i = begin; i < end; ++i) {
    high = std::max(high, logits[order[i]]);
    low = std::min(low, logits[order[i]]);
  }
  const double scale = high > low ? static_cast<double>(buckets) / (static_cast<double>(high) - low) : 0.0;
  auto bucket_of = [&](int32_t token) {
    return std::min(buckets - 1, static_cast<size_t>((static_cast<double>(high) - logits[token]) * scale));
  };
  std::fill(scratch.bucket_mass.begin(), scratch.bucket_mass.end(), 0.0);
  std::fill(scratch.bucket_count.begin(), scratch.bucket_count.end(), 0);
  for (size_t i = begin; i < end; ++i) {
    const size_t b = bucket_of(order[i]);
    scratch.bucket_mass[b] += probability[i];
    ++scratch.bucket_count[b];
  }
  size_t boundary = 0;
  double above = 0.0;
  size_t above_count = 0;
  while (boundary + 1 < buckets && above + scratch.bucket_mass[boundary] < needed) {
    above += scratch.bucket_mass[boundary];
    above_count += scratch.bucket_count[boundary];
    ++boundary;
  }
  // Candidates above the boundary bucket first, then the boundary bucket's, the rest after.
  size_t whole = 0;
  size_t edge = above_count;
  size_t rest = above_count + scratch.bucket_count[boundary];
  for (size_t i = begin; i < end; ++i) {
    const size_t b = bucket_of(order[i]);
    const size_t slot = b < boundary ? whole++ : b == boundary ? edge++ : rest++;
    scratch.spare_order[slot] = order[i];
    scratch.spare_probabilities[slot] = probability[i];
  }
  const size_t count = end - begin;
  std::copy(scratch.spare_order.begin(), scratch.spare_order.begin() + count, order + begin);
  std::copy(scratch.spare_probabilities.begin(), scratch.spare_probabilities.begin() + count, probability + begin);
  // Order the boundary bucket (recomputing its probabilities in the new order) and take from it
  // until the nucleus is complete.
  int32_t* edge_begin = order + begin + above_count;
  double* edge_probability = probability + begin + above_count;
  const size_t edge_count = scratch.bucket_count[boundary];
  std::sort(edge_begin, edge_begin + edge_count, before);
  added = above;
  size_t taken = above_count;
  for (size_t i = 0; i < edge_count; ++i) {
    edge_probability[i] = std::exp((static_cast<double>(logits[edge_begin[i]]) - max_logit) * inverse_temperature);
  }
  for (size_t i = 0; i < edge_count && added < needed; ++i) {
    added += edge_probability[i];
    ++taken;
  }
  return taken;
}

}  // namespace

int32_t SampleProcessed(float temperature, int32_t top_k, float top_p, RandomStream& stream,
                        SamplingScratch& scratch) {
  const std::vector<float>& logits = scratch.logits;
  int32_t* order = scratch.order.data();
  size_t count = 0;
  for (size_t v = 0; v < logits.size(); ++v) {
    if (logits[v] > -std::numeric_limits<float>::infinity()) order[count++] = static_cast<int32_t>(v);  // not NaN
  }
  if (count == 0) return -1;
  auto before = [&logits](int32_t a, int32_t b) {
    const float x = logits[static_cast<size_t>(a)];
    const float y = logits[static_cast<size_t>(b)];
    return x > y || (x == y && a < b);
  };
  size_t kept = count;
  if (top_k > 0 && static_cast<size_t>(top_k) < count) {
    // One pass against a bounded heap whose front is the worst kept candidate: most tokens lose a
    // single comparison with a cache-hot element (cheaper than nth_element over a large vocabulary).
    kept = static_cast<size_t>(top_k);
    std::make_heap(order, order + kept, before);
    for (size_t i = kept; i < count; ++i) {
      if (!before(order[i], order[0])) continue;
      std::pop_heap(order, order + kept, before);
      order[kept - 1] = order[i];
      std::push_heap(order, order + kept, before);
    }
  }
  const bool nucleus = top_p > 0.0f && top_p < 1.0f;
  // Only the nucleus needs an order; sort a leading slice first and widen it only if the slice's
  // mass falls short (a full sort of a large vocabulary per row is the slow case).
  size_t sorted = nucleus ? std::min<size_t>(kept, 1024) : 0;
  if (sorted > 0 && sorted < kept) std::nth_element(order, order + sorted, order + kept, before);
  std::sort(order, order + sorted, before);
  const double inverse_temperature = 1.0 / static_cast<double>(temperature);
  double max_logit = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < kept; ++i) max_logit = std::max(max_logit, static_cast<double>(logits[order[i]]));
  double total = 0.0;
  double* probability = scratch.probabilities.data();
  for (size_t i = 0; i < kept; ++i) {
    probability[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) * inverse_temperature);
    total += probability[i];
  }
  if (nucleus) {
    double cumulative = 0.0;
    size_t cut = 0;
    const double target = static_cast<double>(top_p) * total;
    while (cut < sorted && cumulative < target) cumulative += probability[cut++];
    if (cumulative < target && sorted < kept) {
      // The sorted slice fell short: take the rest of the nucleus from the unsorted candidates.
      double added = 0.0;
      cut += ExtendNucleus(sorted, kept, target - cumulative, logits, before, max_logit, inverse_temperature, scratch,
                           added);
      cumulative += added;
    }
    kept = std::max<size_t>(cut, 1);
    total = cumulative > 0 ? cumulative : probability[0];
  }
  double target = stream.Uniform() * total;
  for (size_t i = 0; i < kept; ++i) {
    target -= probability[i];
    if (target < 0) return order[i];
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
