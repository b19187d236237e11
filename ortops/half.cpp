#include "half.h"

#include <cstring>

namespace ortops {

float HalfToFloat(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int shift = 0;
      uint32_t m = mantissa;
      while ((m & 0x400u) == 0) {
        m <<= 1;
        ++shift;
      }
      bits = sign | static_cast<uint32_t>(127 - 15 - shift + 1) << 23 | (m & 0x3FFu) << 13;
    }
  } else if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

Half FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u)                                   // inf or NaN (NaN stays a quiet NaN)
    return static_cast<Half>(sign | 0x7C00u | (magnitude > 0x7F800000u ? 0x200u | (magnitude >> 13 & 0x3FFu) : 0));
  if (magnitude >= 0x477FF000u) return static_cast<Half>(sign | 0x7C00u);   // rounds past 65504: inf
  if (magnitude < 0x38800000u) {                                  // below 2^-14: a subnormal half (or 0)
    if (magnitude < 0x33000000u) return static_cast<Half>(sign);  // below half of 2^-24: 0
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;       // the value in units of 2^-24: mantissa x 2^(exponent - 126)
    const uint32_t value = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    const uint32_t rounded = value + (rest > halfway || (rest == halfway && (value & 1u)));
    return static_cast<Half>(sign | rounded);
  }
  // normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even
  uint32_t half = ((magnitude >> 13) - (112u << 10));
  const uint32_t rest = magnitude & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: right
  return static_cast<Half>(sign | half);
}

}  // namespace ortops
