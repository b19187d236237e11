/*
 * half.h -- IEEE 754 binary16 ("half") values as the operators store them: uint16_t bit patterns,
 * converted to and from float exactly as F16C's vcvtph2ps / vcvtps2ph (round to nearest even) do.
 */
#ifndef OGA_ORTOPS_HALF_H_
#define OGA_ORTOPS_HALF_H_

#include <cstdint>

namespace ortops {

using Half = uint16_t;

float HalfToFloat(Half h);
Half FloatToHalf(float f);

inline float ToFloat(float x) { return x; }
inline float ToFloat(Half h) { return HalfToFloat(h); }

}  // namespace ortops

#endif  // OGA_ORTOPS_HALF_H_
