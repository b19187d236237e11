#include "paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "attention_math.h"
#include "block_offsets.h"
#include "library_state.h"

namespace ortops {

using namespace ortapi;

const InputSpec PagedGroupQueryAttentionFloatCache::kInputs[] = {
    {kFloat, false}, {kFloat, true},  {kFloat, true},  {kFloat, false}, {kFloat, false},
    {kInt32, false}, {kInt32, false}, {kInt32, false}, {kFloat, true},  {kFloat, true},
    {kFloat, true},  {kFloat16, true}, {kFloat, true},  {kFloat, true},  {kFloat, true},
};
const OutputSpec PagedGroupQueryAttentionFloatCache::kOutputs[] = {{kFloat, false}, {kFloat, false}, {kFloat, false}};

const InputSpec PagedGroupQueryAttentionHalfCache::kInputs[] = {
    {kFloat, false}, {kFloat, true},  {kFloat, true},  {kFloat16, false}, {kFloat16, false},
    {kInt32, false}, {kInt32, false}, {kInt32, false}, {kFloat, true},    {kFloat, true},
    {kFloat, true},  {kFloat16, true},   {kFloat, true},  {kFloat, true},  {kFloat, true},
};
const OutputSpec PagedGroupQueryAttentionHalfCache::kOutputs[] = {
    {kFloat, false}, {kFloat16, false}, {kFloat16, false}};

PagedGroupQueryAttention::PagedGroupQueryAttention(const KernelInfo& info) {
  int64_t heads = info.Int("num_heads");
  int64_t kv_heads = info.Int("kv_num_heads");
  Require(heads > 0 && kv_heads > 0 && heads % kv_heads == 0,
          "num_heads (" + std::to_string(heads) + ") must be a positive multiple of kv_num_heads (" +
              std::to_string(kv_heads) + ")");
  num_heads_ = static_cast<int>(heads);
  kv_num_heads_ = static_cast<int>(kv_heads);
  scale_ = info.Float("scale", 0.0f);
  Require(std::isfinite(scale_) && scale_ >= 0.0f, "scale must be finite and >= 0 (0: 1/sqrt(head_size))");
  do_rotary_ = info.Int("do_rotary", 0) != 0;
  rotary_interleaved_ = info.Int("rotary_interleaved", 0) != 0;
  int64_t window = info.Int("local_window_size", -1);
  Require(window == -1 || window > 0, "local_window_size must be -1 (none) or positive, got " + std::to_string(window));
  window_ = window > 0 ? static_cast<int>(window) : 0;
  softcap_ = info.Float("softcap", 0.0f);
  Require(std::isfinite(softcap_) && softcap_ >= 0.0f, "softcap must be finite and >= 0 (0: none)");
  rope_switch_length_ = info.Int("rope_switch_length", 0);
  Require(rope_switch_length_ >= 0, "rope_switch_length must be >= 0 (0: one pair of RoPE tables), got " +
                                        std::to_string(rope_switch_length_));
}

namespace {

// Keys per work unit of a decoding row: at most kDecodeChunk; fewer (not under kMinDecodeChunk)
// when the step has too few keys to keep kDecodeUnits units busy (one long row at batch 1).
constexpr int64_t kDecodeChunk = 256;
constexpr int64_t kMinDecodeChunk = 64;
constexpr int64_t kDecodeUnits = 8;
constexpr int64_t kPrefillTile = 16;   // query tokens per work unit of a prefilling row

// Scratch purposes (ThreadScratch tags).
struct RotatedQueryTag;
struct RotatedKeyTag;
struct CorrectedQueryTag;
struct TokenRowTag;
struct PartialSumsTag;
struct ScoreTag;
struct TileTag;

// One call's geometry and buffers, checked.
struct Step {
  int64_t tokens = 0, rows = 0, num_blocks = 0, block_size = 0, table_columns = 0;
  int heads = 0, kv_heads = 0, group = 0, head_dim = 0, rotary_half = 0;
  bool interleaved = false;
  int window = 0;
  float scale = 1.0f;
  float softcap = 0.0f;           // 0: none
  const float* sink = nullptr;    // per query head, or NULL
  const int32_t* cu = nullptr;
  const int32_t* past = nullptr;
  const int32_t* table = nullptr;
  const float* q = nullptr;  // token t's query head h at q + t * q_stride + h * D
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  // LongRoPE: a row longer than rope_switch positions (past + this step's tokens) rotates with the
  // long tables; 0: one pair of tables for every row.
  int64_t rope_switch = 0;
  const float* cos_long = nullptr;
  const float* sin_long = nullptr;
  bool half_cache = false;   // the caches hold Half (float16) values, else float
  void* key_cache = nullptr;
  void* value_cache = nullptr;
  float* out = nullptr;
  Shape output_shape;  // the query's shape with the last dimension num_heads x head_size
  int64_t slot_stride = 0;   // values per cache slot (kv_heads * D)
  int64_t block_stride = 0;  // values per cache block

  template <typename T>
  T* Keys() const { return static_cast<T*>(key_cache); }
  template <typename T>
  T* Values() const { return static_cast<T*>(value_cache); }

  int64_t Offset(int64_t row, int64_t position) const {
    int64_t block = table[row * table_columns + position / block_size];
    return block * block_stride + (position % block_size) * slot_stride;
  }
  // The lowest key position a query at `position` sees.
  int64_t FirstKey(int64_t position) const { return window ? std::max<int64_t>(0, position - window + 1) : 0; }

  // scores[i] = softcap * tanh(scores[i] / softcap) for i < n, when the step has a softcap.
  void Softcap(float* scores, int64_t n) const {
    if (softcap == 0.0f) return;
    const float inverse = 1.0f / softcap;
    for (int64_t i = 0; i < n; ++i) scores[i] = softcap * std::tanh(scores[i] * inverse);
  }

  // The factor that turns head h's weights exp(score - max) into probabilities: 1 / the
  // denominator, which with an attention sink also holds exp(sink - max). Both are taken relative
  // to max(max, sink), so a sink far above the scores cannot overflow.
  float Normalizer(int h, float max, float sum) const {
    if (sink == nullptr) return 1.0f / sum;
    const float top = std::max(max, sink[h]);
    const float rescale = std::exp(max - top);
    return rescale / (sum * rescale + std::exp(sink[h] - top));
  }
};

// The RoPE tables row `row` rotates with (cos, sin).
std::pair<const float*, const float*> RopeTables(const Step& s, int64_t row) {
  const bool long_tables = s.rope_switch > 0 && int64_t{s.past[row]} + (s.cu[row + 1] - s.cu[row]) > s.rope_switch;
  return long_tables ? std::make_pair(s.cos_long, s.sin_long) : std::make_pair(s.cos, s.sin);
}

// x (D floats) rotated at `position` with tables (cos, sin) into out, times `factor`.
void Rotate(const Step& s, const float* x, int64_t position, const std::pair<const float*, const float*>& tables,
            float factor, float* out) {
  const int D = s.head_dim, half = s.rotary_half;
  if (half == 0) {
    for (int d = 0; d < D; ++d) out[d] = x[d] * factor;
    return;
  }
  const float* c = tables.first + position * half;
  const float* n = tables.second + position * half;
  if (s.interleaved) {
    for (int i = 0; i < half; ++i) {
      float a = x[2 * i], b = x[2 * i + 1];
      out[2 * i] = (a * c[i] - b * n[i]) * factor;
      out[2 * i + 1] = (b * c[i] + a * n[i]) * factor;
    }
  } else {
    for (int i = 0; i < half; ++i) {
      float a = x[i], b = x[i + half];
      out[i] = (a * c[i] - b * n[i]) * factor;
      out[i + half] = (b * c[i] + a * n[i]) * factor;
    }
  }
  for (int d = 2 * half; d < D; ++d) out[d] = x[d] * factor;
}

// A unit of attention work: a decoding row's key chunk, or a prefilling row's query tile of one
// kv head. `partial` >= 0: the chunk's slot in the partial-sums buffer (rows with several chunks).
struct Unit {
  int64_t row;
  int64_t begin, end;  // decode: key positions; prefill: query offsets within the row
  int head;            // prefill: kv head
  bool decode;
  int64_t partial;
  int64_t cost;
};

// A run of consecutive slots of one block: key positions [position, position + count) of a row,
// the first at `offset` (values) in the caches.
struct Run {
  int64_t position;
  int64_t count;
  int64_t offset;
};

// The runs covering key positions [begin, end) of `row`, each at most `limit` long, into `runs`.
void CollectRuns(const Step& s, int64_t row, int64_t begin, int64_t end, int64_t limit, std::vector<Run>& runs) {
  runs.clear();
  for (int64_t p = begin; p < end;) {
    const int64_t block_end = (p / s.block_size + 1) * s.block_size;
    const int64_t n = std::min({end, block_end, p + limit}) - p;
    runs.push_back(Run{p, n, s.Offset(row, p)});
    p += n;
  }
}

// Keys this many runs ahead are prefetched while a run is scored (into L2: 4 blocks of 16 slots
// of SmolLM2 are 48 KB).
constexpr size_t kPrefetchRuns = 4;

// A decoding row's key chunk. A row with one chunk writes its output directly; otherwise the chunk
// leaves unnormalized partial sums in its slot of `partials`: [H maxes][H sums][H x D weighted values].
template <typename T>
void DecodeChunk(const Step& s, const AttentionMath& math, const Unit& u, const float* rotated, float* partials) {
  const T* keys = s.Keys<T>();
  const T* values = s.Values<T>();
  const CacheMath<T>& cm = math.cache(keys);
  const int64_t t = s.cu[u.row];
  const int D = s.head_dim, H = s.heads, g = s.group;
  const int padded = PaddedHeads(H);
  const int64_t n = u.end - u.begin;
  thread_local std::vector<Run> runs;
  CollectRuns(s, u.row, u.begin, u.end, n, runs);
  float* S = ThreadScratch<ScoreTag>(static_cast<size_t>(n) * padded + 2 * padded);
  float* maxes = S + n * padded;
  float* sums = maxes + padded;
  const float* query = rotated + t * H * D;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    // While scoring this run: the keys of a later run and this run's values, which the second
    // pass reads, come into L2.
    const T* ahead = i + kPrefetchRuns < runs.size() ? keys + runs[i + kPrefetchRuns].offset : nullptr;
    cm.decode_scores(query, H, g, keys + run.offset, s.slot_stride, static_cast<int>(run.count), D,
                     S + (run.position - u.begin) * padded, padded, ahead, values + run.offset);
  }
  s.Softcap(S, n * padded);
  math.softmax_columns(S, static_cast<int>(n), padded, padded, maxes, sums);
  const bool alone = u.partial < 0;
  float* slot = alone ? nullptr : partials + u.partial * H * (D + 2);
  float* o = alone ? s.out + t * H * D : slot + 2 * H;
  std::memset(o, 0, sizeof(float) * H * D);
  for (const Run& run : runs)
    cm.decode_accumulate(S + (run.position - u.begin) * padded, padded, H, g, values + run.offset, s.slot_stride,
                         static_cast<int>(run.count), D, o);
  for (int h = 0; h < H; ++h) {
    if (alone) {
      const float inv = s.Normalizer(h, maxes[h], sums[h]);
      for (int d = 0; d < D; ++d) o[h * D + d] *= inv;
    } else {
      slot[h] = maxes[h];
      slot[H + h] = sums[h];
    }
  }
}

template <typename T>
void PrefillTile(const Step& s, const AttentionMath& math, const Unit& u, const float* rotated) {
  const T* keys = s.Keys<T>();
  const T* values = s.Values<T>();
  const CacheMath<T>& cm = math.cache(keys);
  const int D = s.head_dim, H = s.heads, g = s.group;
  const int64_t first = s.cu[u.row], past = s.past[u.row];
  const int64_t tile = u.end - u.begin;
  const int rows = static_cast<int>(tile * g);
  const int64_t key_lo = s.FirstKey(past + u.begin), key_hi = past + u.end;
  const int64_t L = key_hi - key_lo;
  const int64_t stride = L + kTileKeys;  // a run's scores may spill kTileKeys - 1 columns past it
  float* tile_buffer = ThreadScratch<TileTag>(static_cast<size_t>(rows) * D * 2 + D * kTileKeys);
  float* Q = tile_buffer;
  float* O = Q + static_cast<size_t>(rows) * D;
  float* pack = O + static_cast<size_t>(rows) * D;
  float* S = ThreadScratch<ScoreTag>(static_cast<size_t>(rows) * stride);
  for (int64_t tt = 0; tt < tile; ++tt)
    for (int i = 0; i < g; ++i)
      std::memcpy(Q + (tt * g + i) * D, rotated + ((first + u.begin + tt) * H + u.head * g + i) * D, sizeof(float) * D);
  thread_local std::vector<Run> runs;
  CollectRuns(s, u.row, key_lo, key_hi, kTileKeys, runs);
  for (const Run& run : runs)
    cm.tile_scores(Q, rows, keys + run.offset + u.head * D, s.slot_stride, static_cast<int>(run.count), D,
                   S + (run.position - key_lo), stride, pack);
  for (int64_t tt = 0; tt < tile; ++tt) {
    const int64_t position = past + u.begin + tt;
    const int64_t lo = s.FirstKey(position) - key_lo, hi = position - key_lo + 1;  // columns [lo, hi)
    for (int i = 0; i < g; ++i) {
      float* row = S + (tt * g + i) * stride;
      s.Softcap(row + lo, hi - lo);
      float m = row[lo];
      for (int64_t j = lo + 1; j < hi; ++j) m = std::max(m, row[j]);
      const float sum = math.exp_shifted_sum(row + lo, static_cast<int>(hi - lo), m);
      const float inv = s.Normalizer(u.head * g + i, m, sum);
      for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
      for (int64_t j = lo; j < hi; ++j) row[j] *= inv;
      for (int64_t j = hi; j < L; ++j) row[j] = 0.0f;
    }
  }
  std::memset(O, 0, sizeof(float) * rows * D);
  for (const Run& run : runs)
    cm.tile_accumulate(S + (run.position - key_lo), stride, rows, values + run.offset + u.head * D, s.slot_stride,
                       static_cast<int>(run.count), D, O);
  for (int64_t tt = 0; tt < tile; ++tt)
    for (int i = 0; i < g; ++i)
      std::memcpy(s.out + ((first + u.begin + tt) * H + u.head * g + i) * D, O + (tt * g + i) * D, sizeof(float) * D);
}

// Merges the chunks of a decoding row: o = sum_c e^(m_c - M) o_c / sum_c e^(m_c - M) l_c.
void MergeChunks(const Step& s, int64_t row, int64_t first_partial, int64_t chunks, const float* partials) {
  const int D = s.head_dim, H = s.heads;
  const int64_t slot_floats = static_cast<int64_t>(H) * (D + 2);
  float* out = s.out + s.cu[row] * H * D;
  for (int h = 0; h < H; ++h) {
    float M = -INFINITY;
    for (int64_t c = 0; c < chunks; ++c) M = std::max(M, partials[(first_partial + c) * slot_floats + h]);
    if (s.sink != nullptr) M = std::max(M, s.sink[h]);
    float* o = out + h * D;
    std::memset(o, 0, sizeof(float) * D);
    float denominator = s.sink != nullptr ? std::exp(s.sink[h] - M) : 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* slot = partials + (first_partial + c) * slot_floats;
      const float w = std::exp(slot[h] - M);
      denominator += w * slot[H + h];
      const float* part = slot + 2 * H + h * D;
      for (int d = 0; d < D; ++d) o[d] += w * part[d];
    }
    const float inv = 1.0f / denominator;
    for (int d = 0; d < D; ++d) o[d] *= inv;
  }
}

Step CheckedStep(KernelCall& call, int heads, int kv_heads, float scale, float softcap, bool rotary, bool interleaved,
                 int window, int64_t rope_switch, Tensor* key_cache_in, Tensor* value_cache_in) {
  Step s;
  Tensor query = call.Input(0), key = call.Input(1), value = call.Input(2);
  Tensor key_cache = call.Input(3), value_cache = call.Input(4);
  Tensor table = call.Input(5), cu = call.Input(6), past = call.Input(7);
  // query (and key / value) may carry a leading batch dimension of 1 ([1, N, W], as graphs written
  // for contiguous caches have); the tokens are the rows either way
  Require(query.present() && query.type == kFloat && (query.rank() == 2 || query.rank() == 3),
          "query must be a float32 [num_tokens, width] or [1, num_tokens, width] tensor, got " +
              std::string(ElementTypeName(query.type)) + " " + query.ShapeText());
  Require(query.rank() == 2 || query.dim(0) == 1, "a rank-3 query " + query.ShapeText() + " must have batch 1");
  Require(key_cache.present() && (key_cache.type == kFloat || key_cache.type == kFloat16) && key_cache.rank() == 4,
          "key_cache must be a float32 or float16 tensor of rank 4, got " + std::string(ElementTypeName(key_cache.type)) +
              " " + key_cache.ShapeText());
  Require(value_cache.present() && value_cache.type == key_cache.type,
          "value_cache must have key_cache's type (" + std::string(ElementTypeName(key_cache.type)) + ")");
  RequireTensor(table, "block_table", kInt32, 2);
  RequireTensor(cu, "cumulative_sequence_lengths", kInt32, 1);
  RequireTensor(past, "past_sequence_lengths", kInt32, 1);
  Require(key_cache.shape == value_cache.shape,
          "key_cache " + key_cache.ShapeText() + " and value_cache " + value_cache.ShapeText() + " differ in shape");
  Require(key_cache.dim(2) == kv_heads, "key_cache " + key_cache.ShapeText() + " must have kv_num_heads (" +
                                            std::to_string(kv_heads) + ") heads in dimension 2");
  Require(key_cache.dim(1) > 0 && key_cache.dim(3) > 0, "key_cache " + key_cache.ShapeText() + " has an empty block or head");
  s.half_cache = key_cache.type == kFloat16;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.group = heads / kv_heads;
  s.head_dim = static_cast<int>(key_cache.dim(3));
  s.num_blocks = key_cache.dim(0);
  s.block_size = key_cache.dim(1);
  s.slot_stride = static_cast<int64_t>(kv_heads) * s.head_dim;
  s.block_stride = s.block_size * s.slot_stride;
  s.window = window;
  s.softcap = softcap;
  Tensor sink = call.Input(12);
  if (sink.present()) {
    RequireTensor(sink, "head_sink", kFloat, 1);
    Require(sink.dim(0) == heads, "head_sink " + sink.ShapeText() + " must have num_heads (" + std::to_string(heads) +
                                      ") entries");
    s.sink = sink.as<float>();
  }
  s.scale = scale > 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  s.interleaved = interleaved;
  const int64_t D = s.head_dim;
  const size_t last = query.rank() - 1;
  s.tokens = query.dim(last - 1);
  s.output_shape = query.shape;
  s.output_shape[last] = static_cast<int64_t>(heads) * D;
  if (key.present() || value.present()) {
    RequireTensor(key, "key", kFloat, query.rank());
    RequireTensor(value, "value", kFloat, query.rank());
    Require(query.dim(last) == heads * D, "query " + query.ShapeText() + " must be [num_tokens, " +
                                              std::to_string(heads * D) + "] (num_heads x head_size)");
    for (const Tensor* t : {&key, &value})
      Require(t->dim(last - 1) == s.tokens && t->dim(last) == kv_heads * D,
              "key and value must be [" + std::to_string(s.tokens) + ", " + std::to_string(kv_heads * D) + "], got " +
                  t->ShapeText());
    s.q = query.as<float>();
    s.k = key.as<float>();
    s.v = value.as<float>();
    s.q_stride = heads * D;
    s.k_stride = s.v_stride = kv_heads * D;
  } else {
    const int64_t width = (heads + 2 * kv_heads) * D;
    Require(query.dim(last) == width, "a packed query " + query.ShapeText() + " must be [num_tokens, " +
                                       std::to_string(width) + "] (q|k|v of num_heads + 2 x kv_num_heads heads)");
    s.q = query.as<float>();
    BlockOffsets offsets(call, 10, s.tokens, width);
    if (offsets.present()) {
      // the q|k|v projection's block offsets, added to a copy of its output
      float* corrected = ThreadScratch<CorrectedQueryTag>(static_cast<size_t>(s.tokens * width));
      for (int64_t t = 0; t < s.tokens; ++t) offsets.Corrected(t, s.q + t * width, corrected + t * width);
      s.q = corrected;
    }
    s.k = s.q + heads * D;
    s.v = s.k + kv_heads * D;
    s.q_stride = s.k_stride = s.v_stride = width;
  }
  s.rows = past.dim(0);
  Require(cu.dim(0) == s.rows + 1, "cumulative_sequence_lengths " + cu.ShapeText() + " must have batch_size + 1 (" +
                                       std::to_string(s.rows + 1) + ") entries");
  Require(table.dim(0) == s.rows, "block_table " + table.ShapeText() + " must have batch_size (" +
                                      std::to_string(s.rows) + ") rows");
  s.table_columns = table.dim(1);
  s.cu = cu.as<int32_t>();
  s.past = past.as<int32_t>();
  s.table = table.as<int32_t>();
  Require(s.rows == 0 || s.cu[0] == 0, "cumulative_sequence_lengths must start at 0");
  Require(s.cu[s.rows] == s.tokens, "cumulative_sequence_lengths must end at num_tokens (" + std::to_string(s.tokens) +
                                        "), got " + std::to_string(s.cu[s.rows]));
  int64_t longest = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    const int64_t q = int64_t{s.cu[r + 1]} - s.cu[r], p = s.past[r];
    Require(q >= 0, "cumulative_sequence_lengths must not decrease (row " + std::to_string(r) + ")");
    Require(p >= 0, "past_sequence_lengths[" + std::to_string(r) + "] is negative");
    if (q == 0) continue;
    const int64_t total = p + q;
    longest = std::max(longest, total);
    const int64_t first_column = s.FirstKey(p) / s.block_size, last_column = (total - 1) / s.block_size;
    Require(last_column < s.table_columns, "row " + std::to_string(r) + " reaches position " +
                                               std::to_string(total - 1) + ", past its block_table's " +
                                               std::to_string(s.table_columns) + " columns");
    for (int64_t c = first_column; c <= last_column; ++c) {
      const int64_t block = s.table[r * s.table_columns + c];
      Require(block >= 0 && block < s.num_blocks, "block_table[" + std::to_string(r) + "][" + std::to_string(c) +
                                                      "] = " + std::to_string(block) + " is not a block of the " +
                                                      std::to_string(s.num_blocks) + "-block cache");
    }
  }
  if (rotary) {
    Tensor cos = call.Input(8), sin = call.Input(9);
    RequireTensor(cos, "cos_cache", kFloat, 2);
    RequireTensor(sin, "sin_cache", kFloat, 2);
    Require(cos.shape == sin.shape, "cos_cache " + cos.ShapeText() + " and sin_cache " + sin.ShapeText() +
                                        " differ in shape");
    Require(cos.dim(1) > 0 && 2 * cos.dim(1) <= D, "cos_cache " + cos.ShapeText() +
                                                       " must hold at most head_size / 2 (" + std::to_string(D / 2) +
                                                       ") frequencies");
    Require(longest <= cos.dim(0), "position " + std::to_string(longest - 1) + " is past the " +
                                       std::to_string(cos.dim(0)) + " positions of cos_cache");
    s.rotary_half = static_cast<int>(cos.dim(1));
    s.cos = cos.as<float>();
    s.sin = sin.as<float>();
    Tensor cos_long = call.Input(13), sin_long = call.Input(14);
    Require(cos_long.present() == (rope_switch > 0) && sin_long.present() == (rope_switch > 0),
            "cos_cache_long and sin_cache_long are given exactly when rope_switch_length > 0");
    if (rope_switch > 0) {
      RequireTensor(cos_long, "cos_cache_long", kFloat, 2);
      RequireTensor(sin_long, "sin_cache_long", kFloat, 2);
      Require(cos_long.shape == cos.shape && sin_long.shape == cos.shape,
              "cos_cache_long " + cos_long.ShapeText() + " and sin_cache_long " + sin_long.ShapeText() +
                  " must have cos_cache's shape " + cos.ShapeText());
      s.rope_switch = rope_switch;
      s.cos_long = cos_long.as<float>();
      s.sin_long = sin_long.as<float>();
    }
  } else {
    Require(rope_switch == 0, "rope_switch_length needs do_rotary");
  }
  *key_cache_in = key_cache;
  *value_cache_in = value_cache;
  return s;
}

// The rotary embedding and the cache writes of every token (the rotated, scaled queries into
// `rotated`), then the attention work units, longest first, and the merge of split decode rows.
template <typename T>
void Attend(KernelCall& call, const Step& s, const AttentionMath& math) {
  const int D = s.head_dim, H = s.heads;
  const CacheMath<T>& cm = math.cache(s.Keys<T>());
  float* rotated = ThreadScratch<RotatedQueryTag>(static_cast<size_t>(s.tokens) * H * D);
  int64_t* token_row = ThreadScratch<TokenRowTag, int64_t>(static_cast<size_t>(s.tokens));
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t t = s.cu[r]; t < s.cu[r + 1]; ++t) token_row[t] = r;
  auto write = [&](size_t group) {
    float* key = ThreadScratch<RotatedKeyTag>(static_cast<size_t>(D));
    const int64_t begin = static_cast<int64_t>(group) * kPrefillTile, end = std::min(s.tokens, begin + kPrefillTile);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = token_row[t], position = s.past[r] + (t - s.cu[r]);
      const auto tables = RopeTables(s, r);
      for (int h = 0; h < H; ++h)
        Rotate(s, s.q + t * s.q_stride + h * D, position, tables, s.scale, rotated + (t * H + h) * D);
      const int64_t slot = s.Offset(r, position);
      for (int h = 0; h < s.kv_heads; ++h) {
        Rotate(s, s.k + t * s.k_stride + h * D, position, tables, 1.0f, key);
        cm.store(key, D, s.Keys<T>() + slot + h * D);
        cm.store(s.v + t * s.v_stride + h * D, D, s.Values<T>() + slot + h * D);
      }
    }
  };
  call.ParallelFor(static_cast<size_t>((s.tokens + kPrefillTile - 1) / kPrefillTile), write);

  thread_local std::vector<Unit> units;
  thread_local std::vector<int64_t> first_partial, chunk_count;  // per row: first partial slot (-1: none), chunks
  units.clear();
  first_partial.assign(static_cast<size_t>(s.rows), -1);
  chunk_count.assign(static_cast<size_t>(s.rows), 0);
  int64_t decode_keys = 0;
  for (int64_t r = 0; r < s.rows; ++r)
    if (int64_t{s.cu[r + 1]} - s.cu[r] == 1) decode_keys += s.past[r] + 1 - s.FirstKey(s.past[r]);
  const int64_t chunk_limit =
      std::max(kMinDecodeChunk, std::min(kDecodeChunk, (decode_keys + kDecodeUnits - 1) / kDecodeUnits));
  int64_t partial_count = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    const int64_t q = int64_t{s.cu[r + 1]} - s.cu[r], past = s.past[r];
    if (q == 0) continue;
    if (q == 1) {
      // the row's keys in equal chunks of at most chunk_limit
      const int64_t lo = s.FirstKey(past), hi = past + 1;
      const int64_t chunks = (hi - lo + chunk_limit - 1) / chunk_limit;
      const int64_t length = (hi - lo + chunks - 1) / chunks;
      chunk_count[r] = chunks;
      if (chunks > 1) first_partial[r] = partial_count;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t begin = lo + c * length, end = std::min(hi, begin + length);
        units.push_back(Unit{r, begin, end, 0, true, chunks > 1 ? partial_count++ : -1, (end - begin) * H});
      }
      continue;
    }
    for (int64_t begin = 0; begin < q; begin += kPrefillTile) {
      const int64_t end = std::min(q, begin + kPrefillTile);
      const int64_t keys = past + end - s.FirstKey(past + begin);
      for (int h = 0; h < s.kv_heads; ++h)
        units.push_back(Unit{r, begin, end, h, false, -1, keys * (end - begin) * s.group});
    }
  }
  std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.cost > b.cost; });
  float* partials = ThreadScratch<PartialSumsTag>(static_cast<size_t>(partial_count) * H * (D + 2));
  const Unit* unit_list = units.data();
  call.ParallelFor(units.size(), [&](size_t i) {
    const Unit& u = unit_list[i];
    if (u.decode)
      DecodeChunk<T>(s, math, u, rotated, partials);
    else
      PrefillTile<T>(s, math, u, rotated);
  });
  for (int64_t r = 0; r < s.rows; ++r)
    if (first_partial[r] >= 0) MergeChunks(s, r, first_partial[r], chunk_count[r], partials);
}

}  // namespace

void PagedGroupQueryAttention::Compute(KernelCall& call) {
  Tensor key_cache_in, value_cache_in;
  Step s = CheckedStep(call, num_heads_, kv_num_heads_, scale_, softcap_, do_rotary_, rotary_interleaved_, window_,
                       rope_switch_length_, &key_cache_in, &value_cache_in);
  Tensor out = call.Output(0, s.output_shape);
  Tensor present_key = call.Output(1, key_cache_in.shape);
  Tensor present_value = call.Output(2, value_cache_in.shape);
  const size_t cache_bytes =
      static_cast<size_t>(key_cache_in.elements()) * (s.half_cache ? sizeof(Half) : sizeof(float));
  if (present_key.data != key_cache_in.data) {
    std::memcpy(present_key.data, key_cache_in.data, cache_bytes);
    CountCacheCopy();
  }
  if (present_value.data != value_cache_in.data) {
    std::memcpy(present_value.data, value_cache_in.data, cache_bytes);
    CountCacheCopy();
  }
  s.key_cache = present_key.data;
  s.value_cache = present_value.data;
  s.out = out.as<float>();
  if (s.tokens == 0) return;
  const AttentionMath& math = SelectMath(s.head_dim);
  if (s.half_cache)
    Attend<Half>(call, s, math);
  else
    Attend<float>(call, s, math);
}

}  // namespace ortops
