// The AVX2/FMA loops of logits_head.h, reached through SelectLogitsHeadMath() after a CPU check.
#include "logits_head.h"

#include <algorithm>
#include <cstring>

#include "sampling/block_max.h"
#include "simd_avx2.h"

#if defined(__x86_64__) || defined(_M_X64)

namespace ortops {

namespace {

// `Rows` rows of x against `Group` consecutive packed panels (kPanel = 16 columns each: two
// vectors): 2 * Rows * Group independent accumulators, one broadcast of x[r][k] per row and step,
// every column's sum in k order (the same order for any tile shape, so a row's logits do not depend
// on the rows beside it). With `kPrefetch` the next Group panels are fetched one cache line per
// panel and step (a panel row is one line), so the weight streams from memory while these panels
// are multiplied; the rows' later tiles find them in cache.
template <int Rows, int Group, bool kPrefetch>
OGA_AVX2 inline void PanelTile(const float* x, int64_t hidden, const float* panel, float* out, int64_t vocab,
                               int64_t column) {
  const size_t stride = static_cast<size_t>(hidden) * kPanel;  // floats between panels
  __m256 acc[Rows][2 * Group];
  // Every loop over rows and panels is unrolled: an accumulator indexed at run time would live in
  // memory.
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * Group; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t k = 0; k < hidden; ++k) {
    const float* w = panel + k * kPanel;
    if (kPrefetch)
#pragma GCC unroll 4
      for (int g = 0; g < Group; ++g) _mm_prefetch(reinterpret_cast<const char*>(w + (Group + g) * stride), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * hidden + k);
#pragma GCC unroll 8
      for (int v = 0; v < 2 * Group; ++v)
        acc[r][v] = _mm256_fmadd_ps(a, _mm256_load_ps(w + (v / 2) * stride + (v % 2) * 8), acc[r][v]);
    }
  }
  // The columns of each panel below vocab (the last panel of the weight may be partial).
#pragma GCC unroll 4
  for (int g = 0; g < Group; ++g) {
    const int64_t columns = std::min<int64_t>(kPanel, vocab - column - g * kPanel);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      float* row = out + r * vocab + g * kPanel;
      if (columns == kPanel) {
        _mm256_storeu_ps(row, acc[r][2 * g]);
        _mm256_storeu_ps(row + 8, acc[r][2 * g + 1]);
      } else {
        alignas(32) float sums[kPanel];
        _mm256_store_ps(sums, acc[r][2 * g]);
        _mm256_store_ps(sums + 8, acc[r][2 * g + 1]);
        std::memcpy(row, sums, static_cast<size_t>(columns) * sizeof(float));
      }
    }
  }
}

template <bool kPrefetch>
OGA_AVX2 inline void Tile(int64_t rows, const float* x, int64_t hidden, const float* panel, float* out, int64_t vocab,
                          int64_t column) {
  switch (rows) {
    case 6: PanelTile<6, 1, kPrefetch>(x, hidden, panel, out, vocab, column); break;
    case 5: PanelTile<5, 1, kPrefetch>(x, hidden, panel, out, vocab, column); break;
    case 4: PanelTile<4, 1, kPrefetch>(x, hidden, panel, out, vocab, column); break;
    case 3: PanelTile<3, 1, kPrefetch>(x, hidden, panel, out, vocab, column); break;
    case 2: PanelTile<2, 1, kPrefetch>(x, hidden, panel, out, vocab, column); break;
    default: PanelTile<1, 1, kPrefetch>(x, hidden, panel, out, vocab, column); break;
  }
}

// Up to 3 rows in all (one to three streams decoding): one panel would give too few independent
// sums to hide the FMA latency, so Group panels go at once (at most 12 accumulators); returns the
// first panel left over (fewer than Group remain).
template <int Rows, int Group>
OGA_AVX2 int64_t PanelGroups(const float* x, int64_t hidden, const float* packed, int64_t p0, int64_t p1,
                             int64_t vocab, float* y) {
  int64_t p = p0;
  for (; p + Group <= p1; p += Group)
    PanelTile<Rows, Group, true>(x, hidden, packed + static_cast<size_t>(p) * static_cast<size_t>(hidden) * kPanel,
                                 y + p * kPanel, vocab, p * kPanel);
  return p;
}

// Tiles of at most 6 rows (12 accumulators, two weight vectors and a broadcast: 15 of the 16 vector
// registers); the first tile of each panel prefetches the next panel.
OGA_AVX2 void Panels(const float* x, int64_t rows, int64_t hidden, const float* packed, int64_t p0, int64_t p1,
                     int64_t vocab, float* y) {
  constexpr int64_t kTileRows = 6;
  if (rows == 1) p0 = PanelGroups<1, 4>(x, hidden, packed, p0, p1, vocab, y);
  if (rows == 2) p0 = PanelGroups<2, 3>(x, hidden, packed, p0, p1, vocab, y);
  if (rows == 3) p0 = PanelGroups<3, 2>(x, hidden, packed, p0, p1, vocab, y);
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = packed + static_cast<size_t>(p) * static_cast<size_t>(hidden) * kPanel;
    float* out = y + p * kPanel;
    for (int64_t r = 0; r < rows; r += kTileRows) {
      const int64_t tile = std::min(kTileRows, rows - r);
      if (r == 0 && p + 1 < p1)
        Tile<true>(tile, x, hidden, panel, out, vocab, p * kPanel);
      else
        Tile<false>(tile, x + r * hidden, hidden, panel, out + r * vocab, vocab, p * kPanel);
    }
  }
}

// The engine's own loop (src/sampling/block_max.h): the maxima it reads are the ones it would take.
float BlockMax(const float* data, int64_t count) { return oga::BlockMaxAvx2(data, static_cast<size_t>(count)); }

const LogitsHeadMath kAvx2LogitsHeadMath = {Panels, BlockMax, "avx2"};

}  // namespace

const LogitsHeadMath* Avx2LogitsHeadMath() { return &kAvx2LogitsHeadMath; }

}  // namespace ortops

#else

namespace ortops {
const LogitsHeadMath* Avx2LogitsHeadMath() { return nullptr; }
}  // namespace ortops

#endif
