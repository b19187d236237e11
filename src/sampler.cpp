#include "sampler.h"

#include <algorithm>
#include <cstring>
#include <limits>

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
