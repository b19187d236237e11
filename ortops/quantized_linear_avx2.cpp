// The AVX2 loops of quantized_linear.h (vpmaddubsw + vpmaddwd), reached through
// SelectQuantizedLinearMath() after a CPU check.
#include "quantized_linear.h"

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#define OGA_QL_TARGET __attribute__((target("avx2,fma,f16c")))
#define OGA_QL_NAME "avx2"

namespace ortops {
namespace {

// u * s pairs summed into 16 bits (never saturating: at most 2 * 15 * 127 for the 4-bit codes and
// 2 * 128 * 127 < 2^15 for the 8-bit codes' |w| against |qx| <= 127), then pairs into 32 bits.
OGA_QL_TARGET inline __m256i DotBytes(__m256i acc, __m256i u, __m256i s) {
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

}  // namespace
}  // namespace ortops

#include "quantized_linear_simd.h"

namespace ortops {
const QuantizedLinearMath* Avx2QuantizedLinearMath() { return &kVectorQuantizedLinearMath; }
}  // namespace ortops

#else

namespace ortops {
const QuantizedLinearMath* Avx2QuantizedLinearMath() { return nullptr; }
}  // namespace ortops

#endif
