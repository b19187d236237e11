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
    for (;;) {
      while (cut < sorted && cumulative < static_cast<double>(top_p) * total) cumulative += probability[cut++];
      if (cumulative >= static_cast<double>(top_p) * total || sorted == kept) break;
      std::sort(order + sorted, order + kept, before);  // the slice fell short: order the rest too
      for (size_t i = sorted; i < kept; ++i) {
        probability[i] = std::exp((static_cast<double>(logits[order[i]]) - max_logit) * inverse_temperature);
      }
      sorted = kept;
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

}  // namespace oga
