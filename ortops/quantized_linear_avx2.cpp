// The AVX2 loops of quantized_linear.h (vpmaddubsw + vpmaddwd), reached through
// SelectQuantizedLinearMath() after a CPU check.
#include "quantized_linear.h"

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#define OGA_QL_TARGET __attribute__((target("avx2,fma,f16c")))

namespace ortops {
namespace {

// 4-bit: u (0..15) * s pairs summed into 16 bits, and the 4 such sums of a block's half too (at most
// 4 * 2 * 15 * 128 < 2^15), then widened: one vpmaddwd per half block instead of one a vpmaddubsw.
OGA_QL_TARGET inline __m256i Dot4Start() { return _mm256_setzero_si256(); }
OGA_QL_TARGET inline __m256i Dot4Add(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, s));
}
OGA_QL_TARGET inline __m256i Dot4Finish(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }

// 8-bit: vpmaddubsw multiplies unsigned by signed bytes, and 255 * 127 pairs would saturate, so the
// codes are made signed (w - 128, at most 128 in magnitude) and their signs moved onto the
// activations: |w| * sign(w) s, 2 * 128 * 127 < 2^15 a pair; widened each time.
struct Codes8 {
  __m256i magnitude, sign;
};
OGA_QL_TARGET inline Codes8 Dot8Prepare(__m256i w) {
  const __m256i signed_codes = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
  return {_mm256_abs_epi8(signed_codes), signed_codes};
}
OGA_QL_TARGET inline __m256i Dot8Add(__m256i acc, const Codes8& w, __m256i s) {
  const __m256i pairs = _mm256_maddubs_epi16(w.magnitude, _mm256_sign_epi8(s, w.sign));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
OGA_QL_TARGET inline __m256i Dot8Finish(__m256i acc, int) { return acc; }

}  // namespace
}  // namespace ortops

#include "quantized_linear_simd.h"

namespace ortops {
namespace {
const QuantizedLinearMath kMath = {QuantizeRow, Panels, "avx2"};
}  // namespace
const QuantizedLinearMath* Avx2QuantizedLinearMath() { return &kMath; }
}  // namespace ortops

#else

namespace ortops {
const QuantizedLinearMath* Avx2QuantizedLinearMath() { return nullptr; }
}  // namespace ortops

#endif
