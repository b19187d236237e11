// The AVX-VNNI loops of quantized_linear.h (vpdpbusd: the byte products summed into 32-bit lanes in
// one instruction), reached through SelectQuantizedLinearMath() after a CPU check.
#include "quantized_linear.h"

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

#define OGA_QL_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define OGA_QL_NAME "avx-vnni"

namespace ortops {
namespace {

OGA_QL_TARGET inline __m256i DotBytes(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }

}  // namespace
}  // namespace ortops

#include "quantized_linear_simd.h"

namespace ortops {
const QuantizedLinearMath* VnniQuantizedLinearMath() { return &kVectorQuantizedLinearMath; }
}  // namespace ortops

#else

namespace ortops {
const QuantizedLinearMath* VnniQuantizedLinearMath() { return nullptr; }
}  // namespace ortops

#endif
