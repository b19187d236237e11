#include "quantized_linear.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include "library_state.h"

namespace ortops {

using namespace ortapi;

const InputSpec QuantizedLinear::kInputs[] = {
    {kFloat, false}, {kUint8, false}, {kFloat, false}, {kUint8, true}, {kFloat16, true}};
const OutputSpec QuantizedLinear::kOutputs[] = {{kFloat, false}};

// ---- packing ------------------------------------------------------------------------------------

namespace {

// The code of value i of block `block` (of kQuantBlock values) of column n, in MatMulNBits' B.
inline int CodeAt(const uint8_t* codes, int bits, int64_t block_size, int64_t blocks, int64_t n, int64_t block,
                  int64_t i) {
  const int64_t value = block * kQuantBlock + i;  // index along K
  const int64_t source_block = value / block_size, within = value % block_size;
  const uint8_t* row = codes + (n * blocks + source_block) * (block_size * bits / 8);
  if (bits == 8) return row[within];
  const uint8_t byte = row[within / 2];
  return within % 2 ? byte >> 4 : byte & 0x0F;
}

inline int ZeroPointAt(const uint8_t* zero_points, int bits, int64_t blocks, int64_t n, int64_t source_block) {
  if (zero_points == nullptr) return 1 << (bits - 1);
  if (bits == 8) return zero_points[n * blocks + source_block];
  const int64_t per_row = (blocks + 1) / 2;
  const uint8_t byte = zero_points[n * per_row + source_block / 2];
  return source_block % 2 ? byte >> 4 : byte & 0x0F;
}

bool ExactInHalf(float v) { return HalfToFloat(FloatToHalf(v)) == v || std::isnan(v); }

}  // namespace

PackedQuantizedWeight PackQuantizedWeight(int bits, int64_t block_size, int64_t n, int64_t k, const uint8_t* codes,
                                          const float* scales, const uint8_t* zero_points, const Half* offsets) {
  Require(bits == 4 || bits == 8, "bits must be 4 or 8, got " + std::to_string(bits));
  Require(block_size >= kQuantBlock && block_size % kQuantBlock == 0,
          "block_size must be a multiple of 32, got " + std::to_string(block_size));
  Require(n > 0 && k > 0, "N and K must be above 0, got N " + std::to_string(n) + ", K " + std::to_string(k));
  Require(k % block_size == 0, "K " + std::to_string(k) + " must be a multiple of block_size " +
                                   std::to_string(block_size));
  const int64_t source_blocks = k / block_size, blocks = k / kQuantBlock;
  PackedQuantizedWeight w;
  w.bits = bits;
  w.n = n;
  w.k = k;
  w.panels = (n + kColumns - 1) / kColumns;
  w.pairs = (blocks + 1) / 2;
  w.code_bytes = bits == 4 ? 32 : 64;

  // Per 32-value block of each column: the scale and the offset with the zero point folded in.
  std::vector<float> s(static_cast<size_t>(n * blocks)), c(static_cast<size_t>(n * blocks));
  bool half = true;
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t source = b * kQuantBlock / block_size;
      const float scale = scales[col * source_blocks + source];
      // 8-bit codes are stored as q - 128: the zero point moves by the same 128
      const int z = ZeroPointAt(zero_points, bits, source_blocks, col, source) - (bits == 8 ? 128 : 0);
      const float offset = offsets ? HalfToFloat(offsets[b * n + col]) : 0.0f;
      const size_t i = static_cast<size_t>(col * blocks + b);
      s[i] = scale;
      c[i] = offset - scale * static_cast<float>(z);
      half = half && ExactInHalf(s[i]) && ExactInHalf(c[i]);
    }
  }
  w.half_scales = half;
  const int64_t scale_bytes = half ? 2 : 4;
  w.pair_bytes = kColumns * w.code_bytes + 4 * kColumns * scale_bytes;
  const size_t total = static_cast<size_t>(w.bytes());
  uint8_t* data = static_cast<uint8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64));
  if (data == nullptr) throw std::bad_alloc();
  std::memset(data, 0, total);
  w.data.reset(data);

  for (int64_t p = 0; p < w.panels; ++p) {
    for (int64_t j = 0; j < w.pairs; ++j) {
      uint8_t* pair = data + (p * w.pairs + j) * w.pair_bytes;
      uint8_t* scale_area = pair + kColumns * w.code_bytes;
      for (int64_t col = 0; col < kColumns; ++col) {
        const int64_t column = p * kColumns + col;
        if (column >= n) continue;  // zero codes and scales: the padding sums to 0
        uint8_t* out = pair + col * w.code_bytes;
        for (int half_index = 0; half_index < 2; ++half_index) {
          const int64_t b = 2 * j + half_index;
          if (b >= blocks) continue;  // the padding block of an odd count
          for (int64_t i = 0; i < 16; ++i) {
            const int lo = CodeAt(codes, bits, block_size, source_blocks, column, b, i);
            const int hi = CodeAt(codes, bits, block_size, source_blocks, column, b, i + 16);
            if (bits == 4) {
              out[half_index * 16 + i] = static_cast<uint8_t>(lo | hi << 4);
            } else {
              out[half_index * 16 + i] = static_cast<uint8_t>(static_cast<int8_t>(lo - 128));
              out[32 + half_index * 16 + i] = static_cast<uint8_t>(static_cast<int8_t>(hi - 128));
            }
          }
          const size_t i = static_cast<size_t>(column * blocks + b);
          // s[b], c'[b], s[b+1], c'[b+1]: 8 columns each
          const int64_t s_slot = (2 * half_index) * kColumns + col, c_slot = s_slot + kColumns;
          if (half) {
            reinterpret_cast<Half*>(scale_area)[s_slot] = FloatToHalf(s[i]);
            reinterpret_cast<Half*>(scale_area)[c_slot] = FloatToHalf(c[i]);
          } else {
            reinterpret_cast<float*>(scale_area)[s_slot] = s[i];
            reinterpret_cast<float*>(scale_area)[c_slot] = c[i];
          }
        }
      }
    }
  }
  return w;
}

// ---- portable loops -----------------------------------------------------------------------------

namespace {

// Position of value i (0..31) of block `half_index` (0, 1) of a pair in its 64 bytes.
inline int64_t PairPosition(int half_index, int64_t i) { return (i < 16 ? 0 : 32) + half_index * 16 + i % 16; }

void PortableQuantize(const float* x, int64_t k, int64_t r0, int64_t r1, const QuantizedRows& out) {
  const int64_t blocks = k / kQuantBlock;
  for (int64_t r = r0; r < r1; ++r) {
    int8_t* codes = out.codes + r * out.pairs * 64;
    float* scales = out.scales + r * out.pairs * 2;
    float* sums = out.sums + r * out.pairs * 2;
    for (int64_t b = 0; b < out.pairs * 2; ++b) {
      int8_t* pair = codes + (b / 2) * 64;
      const int half_index = static_cast<int>(b % 2);
      if (b >= blocks) {  // the padding block
        for (int64_t i = 0; i < kQuantBlock; ++i) pair[PairPosition(half_index, i)] = 0;
        scales[b] = 0.0f;
        sums[b] = 0.0f;
        continue;
      }
      const float* v = x + r * k + b * kQuantBlock;
      // the largest magnitude, NaN passed over (the vector loops' max keeps its first operand on NaN)
      float amax = 0.0f;
      bool nan = false;
      for (int64_t i = 0; i < kQuantBlock; ++i) {
        const float a = std::fabs(v[i]);
        amax = a > amax ? a : amax;
        nan = nan || std::isnan(v[i]);
      }
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      for (int64_t i = 0; i < kQuantBlock; ++i) {
        const float scaled = v[i] * inv;
        // NaN (a NaN input, or inf * 0) converts to the vector loops' "integer indefinite", which
        // saturates to -128
        const int q = std::isnan(scaled) ? -128 : static_cast<int>(std::nearbyint(scaled));
        pair[PairPosition(half_index, i)] = static_cast<int8_t>(q);
        sum += q;
      }
      scales[b] = nan ? std::nanf("") : amax / 127.0f;
      sums[b] = static_cast<float>(sum);
    }
  }
}

template <typename Scale>
void PortablePanelsOf(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1, int64_t p0,
                      int64_t p1, float* y, int64_t ldy) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t columns = std::min<int64_t>(kColumns, w.n - p * kColumns);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t col = 0; col < columns; ++col) {
        float acc = 0.0f;
        for (int64_t j = 0; j < w.pairs; ++j) {
          const uint8_t* pair = w.Pair(p, j);
          const uint8_t* codes = pair + col * w.code_bytes;
          const Scale* scales = reinterpret_cast<const Scale*>(pair + kColumns * w.code_bytes);
          const int8_t* qx = x.Codes(r, j);
          for (int half_index = 0; half_index < 2; ++half_index) {
            int32_t dot = 0;
            for (int64_t i = 0; i < kQuantBlock; ++i) {
              int q;
              if (w.bits == 4) {
                const uint8_t byte = codes[half_index * 16 + i % 16];
                q = i < 16 ? byte & 0x0F : byte >> 4;
              } else {
                q = static_cast<int8_t>(codes[PairPosition(half_index, i)]);
              }
              dot += q * qx[PairPosition(half_index, i)];
            }
            const int64_t b = 2 * j + half_index;
            const float s = ToFloat(scales[2 * half_index * kColumns + col]);
            const float c = ToFloat(scales[(2 * half_index + 1) * kColumns + col]);
            const float t = std::fma(s, static_cast<float>(dot), c * x.Sums(r)[b]);
            acc = std::fma(x.Scales(r)[b], t, acc);
          }
        }
        y[r * ldy + p * kColumns + col] = acc;
      }
    }
  }
}

void PortablePanels(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1, int64_t p0,
                    int64_t p1, float* y, int64_t ldy) {
  if (w.half_scales)
    PortablePanelsOf<Half>(w, x, r0, r1, p0, p1, y, ldy);
  else
    PortablePanelsOf<float>(w, x, r0, r1, p0, p1, y, ldy);
}

bool CpuHasAvxVnni() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return CpuHasAvx2FmaF16c() && __builtin_cpu_supports("avxvnni");
#else
  return false;
#endif
}

const QuantizedLinearMath* BestMath() {
  static const QuantizedLinearMath* best = [] {
    if (CpuHasAvxVnni() && VnniQuantizedLinearMath() != nullptr) return VnniQuantizedLinearMath();
    if (CpuHasAvx2FmaF16c() && Avx2QuantizedLinearMath() != nullptr) return Avx2QuantizedLinearMath();
    return &kPortableQuantizedLinearMath;
  }();
  return best;
}

std::atomic<const QuantizedLinearMath*> forced_math{nullptr};

}  // namespace

const QuantizedLinearMath kPortableQuantizedLinearMath = {PortableQuantize, PortablePanels, "portable"};

const QuantizedLinearMath& SelectQuantizedLinearMath() {
  if (const QuantizedLinearMath* forced = forced_math.load(std::memory_order_relaxed)) return *forced;
  return PortableForced() ? kPortableQuantizedLinearMath : *BestMath();
}

bool SetQuantizedLinearMath(const char* name) {
  if (name == nullptr || name[0] == '\0') {
    forced_math.store(nullptr, std::memory_order_relaxed);
    return true;
  }
  const QuantizedLinearMath* chosen = nullptr;
  if (std::strcmp(name, "portable") == 0) chosen = &kPortableQuantizedLinearMath;
  if (std::strcmp(name, "avx2") == 0 && CpuHasAvx2FmaF16c()) chosen = Avx2QuantizedLinearMath();
  if (std::strcmp(name, "avx-vnni") == 0 && CpuHasAvxVnni()) chosen = VnniQuantizedLinearMath();
  if (chosen == nullptr) return false;
  forced_math.store(chosen, std::memory_order_relaxed);
  return true;
}

// ---- the operator -------------------------------------------------------------------------------

namespace {

struct RowsScratchTag {};
const char* const kNotConstant =
    " must be a constant initializer (the weight is repacked once, when the session is created)";

}  // namespace

QuantizedLinear::QuantizedLinear(const KernelInfo& info) {
  const int64_t k = info.Int("K"), n = info.Int("N"), bits = info.Int("bits");
  const int64_t block_size = info.Int("block_size");
  const Tensor codes = info.ConstantInput(1), scales = info.ConstantInput(2);
  const Tensor zero_points = info.ConstantInput(3), offsets = info.ConstantInput(4);
  Require(codes.present(), std::string("codes") + kNotConstant);
  Require(scales.present(), std::string("scales") + kNotConstant);
  has_zero_points_ = zero_points.present();
  has_offsets_ = offsets.present();
  Require(bits == 4 || bits == 8, "bits must be 4 or 8, got " + std::to_string(bits));
  Require(block_size >= kQuantBlock && block_size % kQuantBlock == 0,
          "block_size must be a multiple of 32, got " + std::to_string(block_size));
  Require(n > 0 && k > 0 && k % block_size == 0, "K " + std::to_string(k) + " must be a positive multiple of " +
                                                     "block_size " + std::to_string(block_size) + " and N " +
                                                     std::to_string(n) + " positive");
  const int64_t blocks = k / block_size;
  RequireTensor(codes, "codes", kUint8, 3);
  Require(codes.shape == Shape({n, blocks, block_size * bits / 8}),
          "codes " + codes.ShapeText() + " must be [N, K / block_size, block_size * bits / 8] = [" +
              std::to_string(n) + ", " + std::to_string(blocks) + ", " + std::to_string(block_size * bits / 8) + "]");
  Require(scales.type == kFloat && scales.elements() == n * blocks,
          "scales must be float32 with N * K / block_size = " + std::to_string(n * blocks) + " values, got " +
              ElementTypeName(scales.type) + " " + scales.ShapeText());
  const int64_t zero_point_count = bits == 8 ? n * blocks : n * ((blocks + 1) / 2);
  if (zero_points.present())
    Require(zero_points.type == kUint8 && zero_points.elements() == zero_point_count,
            "zero_points must be uint8 with " + std::to_string(zero_point_count) + " values, got " +
                ElementTypeName(zero_points.type) + " " + zero_points.ShapeText());
  if (offsets.present())
    Require(offsets.type == kFloat16 && offsets.shape == Shape({k / kQuantBlock, n}),
            "block_offsets must be float16 [K / 32, N] = [" + std::to_string(k / kQuantBlock) + ", " +
                std::to_string(n) + "], got " + ElementTypeName(offsets.type) + " " + offsets.ShapeText());
  weight_ = PackQuantizedWeight(static_cast<int>(bits), block_size, n, k, codes.as<uint8_t>(), scales.as<float>(),
                                zero_points.present() ? zero_points.as<uint8_t>() : nullptr,
                                offsets.present() ? offsets.as<Half>() : nullptr);
}

void QuantizedLinear::Compute(KernelCall& call) {
  // An optional weight input that is not a constant initializer was not packed: refuse it rather
  // than compute without it (checked only when the packed weight lacks it, so a warm call of the
  // builder's nodes asks ONNX Runtime for nothing more).
  if (call.InputCount() > 3 && !has_zero_points_ && call.Input(3).present())
    throw OpError(std::string("zero_points") + kNotConstant);
  if (call.InputCount() > 4 && !has_offsets_ && call.Input(4).present())
    throw OpError(std::string("block_offsets") + kNotConstant);
  const Tensor x = call.Input(0);
  Require(x.present() && x.type == kFloat, std::string("x must be float32, got ") + ElementTypeName(x.type));
  Require(x.rank() >= 1 && x.dim(x.rank() - 1) == weight_.k,
          "x " + x.ShapeText() + " must have K = " + std::to_string(weight_.k) + " as its last dimension");
  Shape out_shape = x.shape;
  out_shape[out_shape.size() - 1] = weight_.n;
  Tensor y = call.Output(0, out_shape);
  const int64_t rows = x.elements() / weight_.k;
  if (rows == 0) return;
  const QuantizedLinearMath& math = SelectQuantizedLinearMath();

  // The quantized activations live in the calling thread's scratch: the workers read them while
  // this thread waits in ParallelFor.
  QuantizedRows q;
  q.rows = rows;
  q.pairs = weight_.pairs;
  q.codes = ThreadScratch<RowsScratchTag, int8_t>(static_cast<size_t>(rows * q.pairs * 64));
  float* floats = ThreadScratch<RowsScratchTag, float>(static_cast<size_t>(rows * q.pairs * 4));
  q.scales = floats;
  q.sums = floats + rows * q.pairs * 2;
  const float* in = x.as<float>();
  const int64_t k = weight_.k;
  constexpr int64_t kQuantizeRows = 16;  // rows per task when quantizing many rows
  if (rows <= kQuantizeRows) {
    math.quantize(in, k, 0, rows, q);
  } else {
    call.ParallelFor(static_cast<size_t>((rows + kQuantizeRows - 1) / kQuantizeRows), [&](size_t t) {
      const int64_t r0 = static_cast<int64_t>(t) * kQuantizeRows;
      math.quantize(in, k, r0, std::min(rows, r0 + kQuantizeRows), q);
    });
  }

  // Tasks of a few panels each (all rows): enough tasks to share between threads, each long enough
  // that a task's weight panels are read from memory once and reused, from cache, by every row.
  const int64_t panels_per_task = rows <= 8 ? 4 : 2;
  const int64_t tasks = (weight_.panels + panels_per_task - 1) / panels_per_task;
  float* out = y.as<float>();
  const PackedQuantizedWeight& w = weight_;
  call.ParallelFor(static_cast<size_t>(tasks), [&](size_t t) {
    const int64_t p0 = static_cast<int64_t>(t) * panels_per_task;
    math.panels(w, q, 0, rows, p0, std::min(w.panels, p0 + panels_per_task), out, w.n);
  });
}

}  // namespace ortops
