// The AVX2/FMA/F16C inner loops of attention_math.h (head_dim a multiple of 8), for float and half
// caches. Only the functions of this file are compiled for AVX2 (target attribute), and they are
// reached through SelectMath(), which checks the CPU first, so the library still loads and runs on
// CPUs without AVX2.
#include "attention_math.h"

#include "simd_avx2.h"

#if defined(__x86_64__) || defined(_M_X64)

namespace ortops {

namespace {

// Eight cache values as floats.
OGA_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
OGA_AVX2 inline __m256 Load8(const Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// NH query heads (NH <= 8) of one slot: out[i] = dot(q + i * D, keys[i]) for i < NH, out[NH..8) = 0.
template <int NH, typename T>
OGA_AVX2 inline void SlotHeads(const float* q, const T* const* keys, int D, float* out) {
  __m256 acc[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int d = 0; d < D; d += 8) {
#pragma GCC unroll 8
    for (int i = 0; i < NH; ++i)
      acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(q + static_cast<size_t>(i) * D + d), Load8(keys[i] + d), acc[i]);
  }
  _mm256_storeu_ps(out, TransposedSums(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]));
}

OGA_AVX2 inline void PrefetchSlot(const void* slot, size_t bytes) {
  const char* p = static_cast<const char*>(slot);
  for (size_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(p + offset, _MM_HINT_T1);
}

template <typename T>
OGA_AVX2 void DecodeScores(const float* q, int heads, int group, const T* k, size_t slot_stride, int n, int D,
                           float* S, size_t s_stride, const T* ahead0, const T* ahead1) {
  const size_t slot_bytes = slot_stride * sizeof(T);
  for (int j = 0; j < n; ++j) {
    const T* slot = k + j * slot_stride;
    if (ahead0 != nullptr) PrefetchSlot(ahead0 + j * slot_stride, slot_bytes);
    if (ahead1 != nullptr) PrefetchSlot(ahead1 + j * slot_stride, slot_bytes);
    float* row = S + j * s_stride;
    for (int h0 = 0; h0 < heads; h0 += 8) {
      const T* keys[8];
      const int count = heads - h0 < 8 ? heads - h0 : 8;
      for (int i = 0; i < count; ++i) keys[i] = slot + ((h0 + i) / group) * D;
      const float* qh = q + static_cast<size_t>(h0) * D;
      switch (count) {
        case 8: SlotHeads<8>(qh, keys, D, row + h0); break;
        case 7: SlotHeads<7>(qh, keys, D, row + h0); break;
        case 6: SlotHeads<6>(qh, keys, D, row + h0); break;
        case 5: SlotHeads<5>(qh, keys, D, row + h0); break;
        case 4: SlotHeads<4>(qh, keys, D, row + h0); break;
        case 3: SlotHeads<3>(qh, keys, D, row + h0); break;
        case 2: SlotHeads<2>(qh, keys, D, row + h0); break;
        default: SlotHeads<1>(qh, keys, D, row + h0); break;
      }
    }
  }
}

// o[d] += sum_{j < n} p[j * p_stride] * v[j * stride + d]
template <typename T>
OGA_AVX2 void Accumulate(const float* p, size_t p_stride, const T* v, size_t stride, int n, int D, float* o) {
  int d = 0;
  for (; d + 64 <= D; d += 64) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_loadu_ps(o + d + 8 * i);
    for (int j = 0; j < n; ++j) {
      const T* value = v + j * stride + d;
      const __m256 w = _mm256_broadcast_ss(p + j * p_stride);
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(w, Load8(value + 8 * i), acc[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(o + d + 8 * i, acc[i]);
  }
  for (; d < D; d += 8) {
    __m256 acc = _mm256_loadu_ps(o + d);
    for (int j = 0; j < n; ++j)
      acc = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j * p_stride), Load8(v + j * stride + d), acc);
    _mm256_storeu_ps(o + d, acc);
  }
}

constexpr int kValueWindow = 8;  // slots per pass over every head in decode_accumulate

template <typename T>
OGA_AVX2 void DecodeAccumulate(const float* S, size_t s_stride, int heads, int group, const T* v, size_t slot_stride,
                               int n, int D, float* o) {
  for (int j = 0; j < n; j += kValueWindow) {
    const int count = n - j < kValueWindow ? n - j : kValueWindow;
    const T* slots = v + j * slot_stride;
    for (int h = 0; h < heads; ++h)
      Accumulate(S + j * s_stride + h, s_stride, slots + (h / group) * D, slot_stride, count, D,
                 o + static_cast<size_t>(h) * D);
  }
}

// Keys j < n (key j at k + j * stride) transposed into pack[d * 16 + j], zero past n.
template <typename T>
OGA_AVX2 void PackKeys(const T* k, size_t stride, int n, int D, float* pack) {
  alignas(32) float row[8];
  for (int j = 0; j < kTileKeys; ++j) {
    if (j < n) {
      const T* key = k + j * stride;
      for (int d = 0; d < D; d += 8) {
        _mm256_store_ps(row, Load8(key + d));
        for (int i = 0; i < 8; ++i) pack[(d + i) * kTileKeys + j] = row[i];
      }
    } else {
      for (int d = 0; d < D; ++d) pack[d * kTileKeys + j] = 0.0f;
    }
  }
}

// R query rows x 16 packed keys: 2R accumulators.
template <int R>
OGA_AVX2 void ScoreRows(const float* Q, const float* pack, int D, float* S, size_t s_stride) {
  __m256 lo[R], hi[R];
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) lo[i] = hi[i] = _mm256_setzero_ps();
  for (int d = 0; d < D; ++d) {
    __m256 k0 = _mm256_loadu_ps(pack + d * kTileKeys);
    __m256 k1 = _mm256_loadu_ps(pack + d * kTileKeys + 8);
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      __m256 qb = _mm256_broadcast_ss(Q + static_cast<size_t>(i) * D + d);
      lo[i] = _mm256_fmadd_ps(qb, k0, lo[i]);
      hi[i] = _mm256_fmadd_ps(qb, k1, hi[i]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i) {
    _mm256_storeu_ps(S + i * s_stride, lo[i]);
    _mm256_storeu_ps(S + i * s_stride + 8, hi[i]);
  }
}

template <typename T>
OGA_AVX2 void TileScores(const float* Q, int rows, const T* k, size_t stride, int n, int D, float* S, size_t s_stride,
                         float* pack) {
  PackKeys(k, stride, n, D, pack);
  int r = 0;
  for (; r + 6 <= rows; r += 6) ScoreRows<6>(Q + static_cast<size_t>(r) * D, pack, D, S + r * s_stride, s_stride);
  const float* q = Q + static_cast<size_t>(r) * D;
  float* s = S + r * s_stride;
  switch (rows - r) {
    case 5: ScoreRows<5>(q, pack, D, s, s_stride); break;
    case 4: ScoreRows<4>(q, pack, D, s, s_stride); break;
    case 3: ScoreRows<3>(q, pack, D, s, s_stride); break;
    case 2: ScoreRows<2>(q, pack, D, s, s_stride); break;
    case 1: ScoreRows<1>(q, pack, D, s, s_stride); break;
    default: break;
  }
}

// R output rows x 16 columns of D: 2R accumulators over the n keys.
template <int R, typename T>
OGA_AVX2 void AccumulateRows(const float* P, size_t p_stride, const T* v, size_t stride, int n, int D, float* O) {
  for (int d = 0; d < D; d += 16) {
    const bool wide = d + 16 <= D;
    __m256 lo[R], hi[R];
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      lo[i] = _mm256_loadu_ps(O + static_cast<size_t>(i) * D + d);
      hi[i] = wide ? _mm256_loadu_ps(O + static_cast<size_t>(i) * D + d + 8) : _mm256_setzero_ps();
    }
    for (int j = 0; j < n; ++j) {
      const T* value = v + j * stride + d;
      __m256 v0 = Load8(value);
      __m256 v1 = wide ? Load8(value + 8) : _mm256_setzero_ps();
#pragma GCC unroll 6
      for (int i = 0; i < R; ++i) {
        __m256 pb = _mm256_broadcast_ss(P + i * p_stride + j);
        lo[i] = _mm256_fmadd_ps(pb, v0, lo[i]);
        hi[i] = _mm256_fmadd_ps(pb, v1, hi[i]);
      }
    }
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      _mm256_storeu_ps(O + static_cast<size_t>(i) * D + d, lo[i]);
      if (wide) _mm256_storeu_ps(O + static_cast<size_t>(i) * D + d + 8, hi[i]);
    }
  }
}

template <typename T>
OGA_AVX2 void TileAccumulate(const float* P, size_t p_stride, int rows, const T* v, size_t stride, int n, int D,
                             float* O) {
  int r = 0;
  for (; r + 6 <= rows; r += 6)
    AccumulateRows<6>(P + r * p_stride, p_stride, v, stride, n, D, O + static_cast<size_t>(r) * D);
  const float* p = P + r * p_stride;
  float* o = O + static_cast<size_t>(r) * D;
  switch (rows - r) {
    case 5: AccumulateRows<5>(p, p_stride, v, stride, n, D, o); break;
    case 4: AccumulateRows<4>(p, p_stride, v, stride, n, D, o); break;
    case 3: AccumulateRows<3>(p, p_stride, v, stride, n, D, o); break;
    case 2: AccumulateRows<2>(p, p_stride, v, stride, n, D, o); break;
    case 1: AccumulateRows<1>(p, p_stride, v, stride, n, D, o); break;
    default: break;
  }
}

OGA_AVX2 void StoreFloat(const float* x, int D, float* out) {
  for (int d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_loadu_ps(x + d));
}

OGA_AVX2 void StoreHalf(const float* x, int D, Half* out) {
  for (int d = 0; d < D; d += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + d),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

OGA_AVX2 void SoftmaxColumns(float* S, int n, size_t s_stride, int columns, float* maxes, float* sums) {
  for (int c = 0; c < columns; c += 8) {
    __m256 m = _mm256_loadu_ps(S + c);
    for (int j = 1; j < n; ++j) m = _mm256_max_ps(m, _mm256_loadu_ps(S + j * s_stride + c));
    __m256 sum = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j) {
      __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(S + j * s_stride + c), m));
      _mm256_storeu_ps(S + j * s_stride + c, e);
      sum = _mm256_add_ps(sum, e);
    }
    _mm256_storeu_ps(maxes + c, m);
    _mm256_storeu_ps(sums + c, sum);
  }
}

OGA_AVX2 float ExpShiftedSum(float* x, int n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = HorizontalSum(acc);
  if (i < n) {
    float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int t = 0; t < n - i; ++t) tail[t] = x[i + t];
    __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(tail), s));
    _mm256_storeu_ps(tail, e);
    for (int t = 0; t < n - i; ++t) {
      x[i + t] = tail[t];
      sum += tail[t];
    }
  }
  return sum;
}

const AttentionMath kAvx2Math = {
    {DecodeScores<float>, DecodeAccumulate<float>, TileScores<float>, TileAccumulate<float>, StoreFloat},
    {DecodeScores<Half>, DecodeAccumulate<Half>, TileScores<Half>, TileAccumulate<Half>, StoreHalf},
    SoftmaxColumns,
    ExpShiftedSum,
    "avx2",
};

}  // namespace

const AttentionMath* Avx2Math() { return &kAvx2Math; }

}  // namespace ortops

#else

namespace ortops {
const AttentionMath* Avx2Math() { return nullptr; }
}  // namespace ortops

#endif
