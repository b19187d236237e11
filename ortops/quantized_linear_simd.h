/*
 * quantized_linear_simd.h -- the 8-lane vector loops of quantized_linear.h, written once for every
 * x86 feature level that runs them. The including file (quantized_linear_avx2.cpp, _vnni.cpp)
 * defines, before including this:
 *
 *   OGA_QL_TARGET                  the target attribute of every function here
 *   OGA_QL_NAME                    the loops' name ("avx2", ...)
 *   __m256i DotBytes(acc, u, s)    acc + the products of unsigned bytes u and signed bytes s, four
 *                                  neighbours summed into each 32-bit lane
 *
 * and gets `const QuantizedLinearMath kVectorQuantizedLinearMath`. Lane l of DotBytes is the same
 * exact integer whichever instruction makes it (vpmaddubsw + vpmaddwd never saturate on these
 * ranges), so the feature levels give the same bits.
 */
#ifndef OGA_ORTOPS_QUANTIZED_LINEAR_SIMD_H_
#define OGA_ORTOPS_QUANTIZED_LINEAR_SIMD_H_

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "quantized_linear.h"

namespace ortops {
namespace {

// ---- activations --------------------------------------------------------------------------------

// The largest |v| of 32 values (NaN passed over: max_ps keeps its second operand when either is NaN),
// and whether any is NaN.
OGA_QL_TARGET inline float BlockAmax(const __m256 v[4], bool* nan) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  __m256 unordered = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    m = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), m);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
  }
  *nan = _mm256_movemask_ps(unordered) != 0;
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

OGA_QL_TARGET void Quantize(const float* x, int64_t k, int64_t r0, int64_t r1, const QuantizedRows& out) {
  const int64_t blocks = k / kQuantBlock;
  for (int64_t r = r0; r < r1; ++r) {
    int8_t* codes = out.codes + r * out.pairs * 64;
    float* scales = out.scales + r * out.pairs * 2;
    float* sums = out.sums + r * out.pairs * 2;
    for (int64_t b = 0; b < out.pairs * 2; ++b) {
      int8_t* pair = codes + (b / 2) * 64 + (b % 2) * 16;  // values 0..15 here, 16..31 at +32
      if (b >= blocks) {  // the padding block
        std::memset(pair, 0, 16);
        std::memset(pair + 32, 0, 16);
        scales[b] = 0.0f;
        sums[b] = 0.0f;
        continue;
      }
      const float* v = x + r * k + b * kQuantBlock;
      __m256 values[4];
      for (int i = 0; i < 4; ++i) values[i] = _mm256_loadu_ps(v + 8 * i);
      bool nan = false;
      const float amax = BlockAmax(values, &nan);
      const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      __m256i q[4];
      // round to nearest even (the default rounding mode), as the portable loops' nearbyint
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(values[i], inv));
      // int32 -> int8 with saturation (only NaN's -2^31 saturates, to -128); packs interleave the
      // 128-bit lanes, the permute puts the values back in order
      const __m256i words01 = _mm256_packs_epi32(q[0], q[1]);
      const __m256i words23 = _mm256_packs_epi32(q[2], q[3]);
      __m256i bytes = _mm256_packs_epi16(words01, words23);
      bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair), _mm256_castsi256_si128(bytes));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pair + 32), _mm256_extracti128_si256(bytes, 1));
      // sum of the 32 codes: bytes -> 16-bit pairs -> 32-bit
      const __m256i pairs16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes);
      const __m256i lanes = _mm256_madd_epi16(pairs16, _mm256_set1_epi16(1));
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
      scales[b] = nan ? __builtin_nanf("") : amax / 127.0f;
      sums[b] = static_cast<float>(_mm_cvtsi128_si32(s));
    }
  }
}

// ---- the panels ---------------------------------------------------------------------------------

// 32-bit lanes of one column and one pair of blocks: lanes 0-3 block b, 4-7 block b+1.
template <int Bits>
OGA_QL_TARGET inline __m256i ColumnDot(const uint8_t* codes, const int8_t* qx) {
  const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
  const __m256i xb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + 32));
  if (Bits == 4) {
    const __m256i nibbles = _mm256_set1_epi8(0x0F);
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes));
    const __m256i lo = _mm256_and_si256(w, nibbles);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibbles);
    return DotBytes(DotBytes(_mm256_setzero_si256(), lo, xa), hi, xb);
  }
  // signed codes: |w| (unsigned, at most 128) against qx with w's sign
  const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes));
  const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + 32));
  const __m256i acc = DotBytes(_mm256_setzero_si256(), _mm256_abs_epi8(w0), _mm256_sign_epi8(xa, w0));
  return DotBytes(acc, _mm256_abs_epi8(w1), _mm256_sign_epi8(xb, w1));
}

// The 8 columns' exact dot products of block b (first) and b+1 from their 32-bit lanes.
OGA_QL_TARGET inline void ColumnSums(const __m256i v[8], __m256i* block0, __m256i* block1) {
  const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i h23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i h67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i g0 = _mm256_hadd_epi32(h01, h23);  // [c0..c3 of b | c0..c3 of b+1]
  const __m256i g1 = _mm256_hadd_epi32(h45, h67);  // [c4..c7 of b | c4..c7 of b+1]
  *block0 = _mm256_permute2x128_si256(g0, g1, 0x20);
  *block1 = _mm256_permute2x128_si256(g0, g1, 0x31);
}

OGA_QL_TARGET inline __m256 LoadScales(const float* p) { return _mm256_load_ps(p); }
OGA_QL_TARGET inline __m256 LoadScales(const Half* p) {
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
}

// acc = fma(dx, fma(s, D, c' * S), acc): quantized_linear.h's one order of operations.
OGA_QL_TARGET inline __m256 Accumulate(__m256 acc, __m256i dots, __m256 s, __m256 c, float dx, float sum) {
  const __m256 t = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dots), _mm256_mul_ps(c, _mm256_set1_ps(sum)));
  return _mm256_fmadd_ps(_mm256_set1_ps(dx), t, acc);
}

// Rows r0 .. r0+R-1 against panel p: every column pair unpacked once for the R rows.
template <int R, int Bits, typename Scale>
OGA_QL_TARGET inline void PanelTile(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t p,
                                    float* y, int64_t ldy) {
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t j = 0; j < w.pairs; ++j) {
    const uint8_t* pair = w.Pair(p, j);
    const Scale* scales = reinterpret_cast<const Scale*>(pair + kColumns * w.code_bytes);
    __m256i lanes[R][8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) lanes[r][c] = ColumnDot<Bits>(pair + c * w.code_bytes, x.Codes(r0 + r, j));
    const __m256 s0 = LoadScales(scales), c0 = LoadScales(scales + kColumns);
    const __m256 s1 = LoadScales(scales + 2 * kColumns), c1 = LoadScales(scales + 3 * kColumns);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m256i d0, d1;
      ColumnSums(lanes[r], &d0, &d1);
      const float* dx = x.Scales(r0 + r) + 2 * j;
      const float* sums = x.Sums(r0 + r) + 2 * j;
      acc[r] = Accumulate(acc[r], d0, s0, c0, dx[0], sums[0]);
      acc[r] = Accumulate(acc[r], d1, s1, c1, dx[1], sums[1]);
    }
  }
  const int64_t columns = std::min<int64_t>(kColumns, w.n - p * kColumns);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* out = y + (r0 + r) * ldy + p * kColumns;
    if (columns == kColumns) {
      _mm256_storeu_ps(out, acc[r]);
    } else {
      alignas(32) float sums[kColumns];
      _mm256_store_ps(sums, acc[r]);
      std::memcpy(out, sums, static_cast<size_t>(columns) * sizeof(float));
    }
  }
}

constexpr int kTileRows = 4;

template <int Bits, typename Scale>
OGA_QL_TARGET void PanelsOf(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1,
                            int64_t p0, int64_t p1, float* y, int64_t ldy) {
  // panel outer, rows inner: a panel is read from memory once, then from cache for the other rows
  for (int64_t p = p0; p < p1; ++p) {
    int64_t r = r0;
    for (; r + kTileRows <= r1; r += kTileRows) PanelTile<kTileRows, Bits, Scale>(w, x, r, p, y, ldy);
    switch (r1 - r) {
      case 3: PanelTile<3, Bits, Scale>(w, x, r, p, y, ldy); break;
      case 2: PanelTile<2, Bits, Scale>(w, x, r, p, y, ldy); break;
      case 1: PanelTile<1, Bits, Scale>(w, x, r, p, y, ldy); break;
      default: break;
    }
  }
}

OGA_QL_TARGET void Panels(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1, int64_t p0,
                          int64_t p1, float* y, int64_t ldy) {
  if (w.bits == 4)
    w.half_scales ? PanelsOf<4, Half>(w, x, r0, r1, p0, p1, y, ldy) : PanelsOf<4, float>(w, x, r0, r1, p0, p1, y, ldy);
  else
    w.half_scales ? PanelsOf<8, Half>(w, x, r0, r1, p0, p1, y, ldy) : PanelsOf<8, float>(w, x, r0, r1, p0, p1, y, ldy);
}

const QuantizedLinearMath kVectorQuantizedLinearMath = {Quantize, Panels, OGA_QL_NAME};

}  // namespace
}  // namespace ortops

#endif  // OGA_ORTOPS_QUANTIZED_LINEAR_SIMD_H_
