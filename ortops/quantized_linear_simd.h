/*
 * quantized_linear_simd.h -- the 8-lane vector loops of quantized_linear.h, written once for every
 * x86 feature level that runs them. The including file (quantized_linear_avx2.cpp, _vnni.cpp)
 * defines, before including this:
 *
 *   OGA_QL_TARGET    the target attribute of every function here
 *   the exact integer dot products of 4 unsigned codes and 4 activation codes per 32-bit lane:
 *     __m256i Dot4Start(); Dot4Add(acc, u, s); Dot4Finish(acc)        4-bit codes 0..15 in u
 *     Codes8 Dot8Prepare(w); Dot8Add(acc, Codes8, s); Dot8Finish(acc, S)
 *                      8-bit: w the unsigned codes, the result that of the signed codes w - 128
 *                      (S: the block's sum of activation codes)
 *
 * and gets QuantizeRow and Panels (QuantizedLinearMath's two loops) and the 8-column PanelsOf it
 * builds on. Every lane's dot product is an
 * exact integer whichever instructions make it, so the feature levels give the same bits.
 */
#ifndef OGA_ORTOPS_QUANTIZED_LINEAR_SIMD_H_
#define OGA_ORTOPS_QUANTIZED_LINEAR_SIMD_H_

#include <immintrin.h>

#include <algorithm>
#include <cmath>
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

OGA_QL_TARGET void QuantizeRow(const float* x, int64_t r, const QuantizedRows& out) {
  for (int64_t b = 0; b < out.blocks; ++b) {
    int8_t* codes = out.codes + (r * out.blocks + b) * kQuantBlock;
    const float* v = x + b * kQuantBlock;
    __m256 values[4];
    for (int i = 0; i < 4; ++i) values[i] = _mm256_loadu_ps(v + 8 * i);
    bool nan = false;
    const float amax = BlockAmax(values, &nan);
    if (nan || amax == INFINITY) {  // the row's outputs are NaN
      std::memset(codes, 0, kQuantBlock);
      out.scales[r * out.blocks + b] = __builtin_nanf("");
      out.sums[r * out.blocks + b] = 0.0f;
      continue;
    }
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    // round to nearest even (the default rounding mode), as the portable loops' nearbyint
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(values[i], inv));
    // int32 -> int8 (|q| <= 127: nothing saturates); packs interleave the 128-bit lanes, the
    // permute puts the values back in order
    const __m256i words01 = _mm256_packs_epi32(q[0], q[1]);
    const __m256i words23 = _mm256_packs_epi32(q[2], q[3]);
    __m256i bytes = _mm256_packs_epi16(words01, words23);
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), bytes);
    // sum of the 32 codes: bytes -> 16-bit pairs -> 32-bit
    const __m256i pairs16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes);
    const __m256i lanes = _mm256_madd_epi16(pairs16, _mm256_set1_epi16(1));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256(lanes, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    out.scales[r * out.blocks + b] = amax / 127.0f;
    out.sums[r * out.blocks + b] = static_cast<float>(_mm_cvtsi128_si32(s));
  }
}

// ---- the panels ---------------------------------------------------------------------------------

// Activation codes 4t .. 4t+3 in every 32-bit lane.
OGA_QL_TARGET inline __m256i Broadcast4(const int8_t* codes) {
  int32_t four;
  std::memcpy(&four, codes, sizeof(four));
  return _mm256_set1_epi32(four);
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

// Rows r0 .. r0+R-1 against panel p: each block's codes are loaded and unpacked once for the R rows.
template <int R, int Bits, typename Scale>
OGA_QL_TARGET inline void PanelTile(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t p,
                                    float* y, int64_t ldy) {
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i nibbles = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < w.blocks; ++b) {
    const uint8_t* block = w.Block(p, b);
    const int8_t* qx[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) qx[r] = x.Codes(r0 + r, b);
    // two sums per row (the low and high nibbles, or even and odd code vectors), added at the end:
    // half the dependency chain, so a single row keeps the multipliers busy
    __m256i dots[R], more[R];
    if (Bits == 4) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) dots[r] = more[r] = Dot4Start();
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m256i codes = _mm256_load_si256(reinterpret_cast<const __m256i*>(block + 32 * j));
        const __m256i lo = _mm256_and_si256(codes, nibbles);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), nibbles);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          dots[r] = Dot4Add(dots[r], lo, Broadcast4(qx[r] + 4 * j));
          more[r] = Dot4Add(more[r], hi, Broadcast4(qx[r] + 16 + 4 * j));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) dots[r] = _mm256_add_epi32(Dot4Finish(dots[r]), Dot4Finish(more[r]));
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) dots[r] = more[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; j += 2) {
        const Codes8 even = Dot8Prepare(_mm256_load_si256(reinterpret_cast<const __m256i*>(block + 32 * j)));
        const Codes8 odd = Dot8Prepare(_mm256_load_si256(reinterpret_cast<const __m256i*>(block + 32 * j + 32)));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          dots[r] = Dot8Add(dots[r], even, Broadcast4(qx[r] + 4 * j));
          more[r] = Dot8Add(more[r], odd, Broadcast4(qx[r] + 4 * j + 4));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        dots[r] = Dot8Finish(_mm256_add_epi32(dots[r], more[r]), static_cast<int>(x.Sums(r0 + r)[b]));
    }
    const Scale* scales = reinterpret_cast<const Scale*>(block + w.code_bytes);
    const __m256 s = LoadScales(scales), c = LoadScales(scales + kColumns);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = Accumulate(acc[r], dots[r], s, c, x.Scales(r0 + r)[b], x.Sums(r0 + r)[b]);
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

}  // namespace
}  // namespace ortops

#endif  // OGA_ORTOPS_QUANTIZED_LINEAR_SIMD_H_
