// The AVX512-VNNI loops of quantized_linear.h: two 8-column panels side by side in one 512-bit vector
// (16 columns a vpdpbusd), the packed layout unchanged; a last odd panel takes the 8-column loops of
// quantized_linear_simd.h (256-bit vpdpbusd). Reached through SelectQuantizedLinearMath() after a
// CPU check.
#include "quantized_linear.h"

#if defined(__x86_64__) || defined(_M_X64)

#include <immintrin.h>

// GCC 12's AVX-512 intrinsics build their "undefined" operands from a self-initialized variable,
// which -Wmaybe-uninitialized reports at every use (a false positive of the compiler's own headers).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define OGA_QL_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))

namespace ortops {
namespace {

// The 8-column loops' integer dot products (quantized_linear_simd.h), with AVX512-VL's vpdpbusd.
OGA_QL_TARGET inline __m256i Dot4Start() { return _mm256_setzero_si256(); }
OGA_QL_TARGET inline __m256i Dot4Add(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
OGA_QL_TARGET inline __m256i Dot4Finish(__m256i acc) { return acc; }
struct Codes8 {
  __m256i codes;
};
OGA_QL_TARGET inline Codes8 Dot8Prepare(__m256i w) { return {w}; }
OGA_QL_TARGET inline __m256i Dot8Add(__m256i acc, const Codes8& w, __m256i s) {
  return _mm256_dpbusd_epi32(acc, w.codes, s);
}
OGA_QL_TARGET inline __m256i Dot8Finish(__m256i acc, int sum) {
  return _mm256_sub_epi32(acc, _mm256_set1_epi32(sum * 128));
}

}  // namespace
}  // namespace ortops

#include "quantized_linear_simd.h"

namespace ortops {
namespace {

// 32 bytes of panel p's block and 32 of panel p+1's: columns 8p .. 8p+15, 4 codes each.
OGA_QL_TARGET inline __m512i LoadPair(const uint8_t* first, const uint8_t* second) {
  return _mm512_inserti64x4(_mm512_zextsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(first))),
                            _mm256_load_si256(reinterpret_cast<const __m256i*>(second)), 1);
}

OGA_QL_TARGET inline __m512i Broadcast4Wide(const int8_t* codes) {
  int32_t four;
  std::memcpy(&four, codes, sizeof(four));
  return _mm512_set1_epi32(four);
}

OGA_QL_TARGET inline __m512 LoadScalePair(const float* first, const float* second) {
  return _mm512_insertf32x8(_mm512_zextps256_ps512(_mm256_load_ps(first)), _mm256_load_ps(second), 1);
}
OGA_QL_TARGET inline __m512 LoadScalePair(const Half* first, const Half* second) {
  return _mm512_insertf32x8(_mm512_zextps256_ps512(LoadScales(first)), LoadScales(second), 1);
}

// Rows r0 .. r0+R-1 against panels p and p+1: quantized_linear.h's operations per column, 16 at once.
template <int R, int Bits, typename Scale>
OGA_QL_TARGET inline void PanelPairTile(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0,
                                        int64_t p, float* y, int64_t ldy) {
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i nibbles = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < w.blocks; ++b) {
    const uint8_t* first = w.Block(p, b);
    const uint8_t* second = w.Block(p + 1, b);
    const int8_t* qx[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) qx[r] = x.Codes(r0 + r, b);
    __m512i dots[R], more[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) dots[r] = more[r] = _mm512_setzero_si512();
    if (Bits == 4) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i codes = LoadPair(first + 32 * j, second + 32 * j);
        const __m512i lo = _mm512_and_si512(codes, nibbles);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(codes, 4), nibbles);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          dots[r] = _mm512_dpbusd_epi32(dots[r], lo, Broadcast4Wide(qx[r] + 4 * j));
          more[r] = _mm512_dpbusd_epi32(more[r], hi, Broadcast4Wide(qx[r] + 16 + 4 * j));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) dots[r] = _mm512_add_epi32(dots[r], more[r]);
    } else {
#pragma GCC unroll 8
      for (int j = 0; j < 8; j += 2) {
        const __m512i even = LoadPair(first + 32 * j, second + 32 * j);
        const __m512i odd = LoadPair(first + 32 * j + 32, second + 32 * j + 32);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          dots[r] = _mm512_dpbusd_epi32(dots[r], even, Broadcast4Wide(qx[r] + 4 * j));
          more[r] = _mm512_dpbusd_epi32(more[r], odd, Broadcast4Wide(qx[r] + 4 * j + 4));
        }
      }
      // the unsigned codes' sums, made those of the signed codes q - 128
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        dots[r] = _mm512_sub_epi32(_mm512_add_epi32(dots[r], more[r]),
                                   _mm512_set1_epi32(static_cast<int>(x.Sums(r0 + r)[b]) * 128));
    }
    const Scale* s0 = reinterpret_cast<const Scale*>(first + w.code_bytes);
    const Scale* s1 = reinterpret_cast<const Scale*>(second + w.code_bytes);
    const __m512 s = LoadScalePair(s0, s1), c = LoadScalePair(s0 + kColumns, s1 + kColumns);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      // acc = fma(dx, fma(s, D, c' * S), acc), as the 8-column loops
      const __m512 t = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dots[r]),
                                       _mm512_mul_ps(c, _mm512_set1_ps(x.Sums(r0 + r)[b])));
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x.Scales(r0 + r)[b]), t, acc[r]);
    }
  }
  const int64_t columns = std::min<int64_t>(2 * kColumns, w.n - p * kColumns);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* out = y + (r0 + r) * ldy + p * kColumns;
    if (columns == 2 * kColumns) {
      _mm512_storeu_ps(out, acc[r]);
    } else {
      alignas(64) float sums[2 * kColumns];
      _mm512_store_ps(sums, acc[r]);
      std::memcpy(out, sums, static_cast<size_t>(columns) * sizeof(float));
    }
  }
}

constexpr int kWideTileRows = 6;  // 18 of the 32 vector registers for sums, room for codes

// Panels [p0, p1), an even count.
template <int Bits, typename Scale>
OGA_QL_TARGET void WidePanelsOf(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1,
                                int64_t p0, int64_t p1, float* y, int64_t ldy) {
  for (int64_t p = p0; p < p1; p += 2) {
    int64_t r = r0;
    for (; r + kWideTileRows <= r1; r += kWideTileRows) PanelPairTile<kWideTileRows, Bits, Scale>(w, x, r, p, y, ldy);
    switch (r1 - r) {
      case 5: PanelPairTile<5, Bits, Scale>(w, x, r, p, y, ldy); break;
      case 4: PanelPairTile<4, Bits, Scale>(w, x, r, p, y, ldy); break;
      case 3: PanelPairTile<3, Bits, Scale>(w, x, r, p, y, ldy); break;
      case 2: PanelPairTile<2, Bits, Scale>(w, x, r, p, y, ldy); break;
      case 1: PanelPairTile<1, Bits, Scale>(w, x, r, p, y, ldy); break;
      default: break;
    }
  }
}

OGA_QL_TARGET void WidePanels(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1,
                              int64_t p0, int64_t p1, float* y, int64_t ldy) {
  const int64_t even = p0 + (p1 - p0) / 2 * 2;
  if (w.bits == 4)
    w.half_scales ? WidePanelsOf<4, Half>(w, x, r0, r1, p0, even, y, ldy)
                  : WidePanelsOf<4, float>(w, x, r0, r1, p0, even, y, ldy);
  else
    w.half_scales ? WidePanelsOf<8, Half>(w, x, r0, r1, p0, even, y, ldy)
                  : WidePanelsOf<8, float>(w, x, r0, r1, p0, even, y, ldy);
  if (even < p1) Panels(w, x, r0, r1, even, p1, y, ldy);  // a last odd panel: the 8-column loops
}

const QuantizedLinearMath kMath = {QuantizeRow, WidePanels, "avx512-vnni"};

}  // namespace

const QuantizedLinearMath* Avx512QuantizedLinearMath() { return &kMath; }

}  // namespace ortops

#else

namespace ortops {
const QuantizedLinearMath* Avx512QuantizedLinearMath() { return nullptr; }
}  // namespace ortops

#endif
