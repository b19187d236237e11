// The AVX-VNNI loops of quantized_linear.h (vpdpbusd: the byte products summed into 32-bit lanes in
// one instruction), reached through SelectQuantizedLinearMath() after a CPU check.
#include "quantized_linear.h"

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#define OGA_QL_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))

namespace ortops {
namespace {

OGA_QL_TARGET inline __m256i Dot4Start() { return _mm256_setzero_si256(); }
OGA_QL_TARGET inline __m256i Dot4Add(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
OGA_QL_TARGET inline __m256i Dot4Finish(__m256i acc) { return acc; }

// 8-bit: the unsigned codes as they are (vpdpbusd does not saturate), then
// sum (w - 128) s = sum w s - 128 S.
struct Codes8 {
  __m256i codes;
};
OGA_QL_TARGET inline Codes8 Dot8Prepare(__m256i w) { return {w}; }
OGA_QL_TARGET inline __m256i Dot8Add(__m256i acc, const Codes8& w, __m256i s) {
  return _mm256_dpbusd_avx_epi32(acc, w.codes, s);
}
OGA_QL_TARGET inline __m256i Dot8Finish(__m256i acc, int sum) { return _mm256_sub_epi32(acc, _mm256_set1_epi32(sum * 128)); }

}  // namespace
}  // namespace ortops

#include "quantized_linear_simd.h"

namespace ortops {
namespace {
const QuantizedLinearMath kMath = {QuantizeRow, Panels, "avx-vnni"};
}  // namespace
const QuantizedLinearMath* VnniQuantizedLinearMath() { return &kMath; }
}  // namespace ortops

#else

namespace ortops {
const QuantizedLinearMath* VnniQuantizedLinearMath() { return nullptr; }
}  // namespace ortops

#endif
