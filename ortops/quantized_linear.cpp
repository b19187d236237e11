#include "quantized_linear.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include "library_state.h"
#include "row_math.h"

namespace ortops {

using namespace ortapi;

const InputSpec QuantizedLinear::kInputs[] = {{kFloat, false}, {kUint8, false}, {kFloat, false}, {kUint8, true},
                                              {kFloat16, true}, {kFloat, true},  {kFloat, true}};
const OutputSpec QuantizedLinear::kOutputs[] = {{kFloat, false}, {kFloat, true}};

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
  w.blocks = blocks;
  w.code_bytes = bits == 4 ? 128 : 256;

  // Per 32-value block of each column: the scale and the offset with the zero point folded in.
  std::vector<float> s(static_cast<size_t>(n * blocks)), c(static_cast<size_t>(n * blocks));
  bool half = true;
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t source = b * kQuantBlock / block_size;
      const float scale = scales[col * source_blocks + source];
      // D is the dot product of the signed 8-bit codes q - 128: the zero point moves by the same 128
      const int z = ZeroPointAt(zero_points, bits, source_blocks, col, source) - (bits == 8 ? 128 : 0);
      const float offset = offsets ? HalfToFloat(offsets[b * n + col]) : 0.0f;
      const size_t i = static_cast<size_t>(col * blocks + b);
      s[i] = scale;
      c[i] = offset - scale * static_cast<float>(z);
      half = half && ExactInHalf(s[i]) && ExactInHalf(c[i]);
    }
  }
  w.half_scales = half;
  w.block_bytes = w.code_bytes + 2 * kColumns * (half ? 2 : 4);
  const size_t total = static_cast<size_t>(w.bytes());
  uint8_t* data = static_cast<uint8_t*>(std::aligned_alloc(64, (total + 63) / 64 * 64));
  if (data == nullptr) throw std::bad_alloc();
  // padding columns: codes 0 (8-bit: 0, a signed -128, against scales 0), scales 0: they sum to 0
  std::memset(data, 0, total);
  w.data.reset(data);

  for (int64_t p = 0; p < w.panels; ++p) {
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* block = data + (p * blocks + b) * w.block_bytes;
      uint8_t* scale_area = block + w.code_bytes;
      for (int64_t col = 0; col < kColumns; ++col) {
        const int64_t column = p * kColumns + col;
        if (column >= n) continue;
        for (int64_t i = 0; i < kQuantBlock; ++i) {
          const int q = CodeAt(codes, bits, block_size, source_blocks, column, b, i);
          const int64_t j = i / 4, t = i % 4;
          if (bits == 8)
            block[j * 32 + 4 * col + t] = static_cast<uint8_t>(q);
          else if (j < 4)
            block[j * 32 + 4 * col + t] |= static_cast<uint8_t>(q);
          else
            block[(j - 4) * 32 + 4 * col + t] |= static_cast<uint8_t>(q << 4);
        }
        const size_t i = static_cast<size_t>(column * blocks + b);
        if (half) {
          reinterpret_cast<Half*>(scale_area)[col] = FloatToHalf(s[i]);
          reinterpret_cast<Half*>(scale_area)[kColumns + col] = FloatToHalf(c[i]);
        } else {
          reinterpret_cast<float*>(scale_area)[col] = s[i];
          reinterpret_cast<float*>(scale_area)[kColumns + col] = c[i];
        }
      }
    }
  }
  return w;
}

// ---- portable loops -----------------------------------------------------------------------------

namespace {

void PortableQuantizeRow(const float* x, int64_t r, const QuantizedRows& out) {
  for (int64_t b = 0; b < out.blocks; ++b) {
    int8_t* codes = out.codes + (r * out.blocks + b) * kQuantBlock;
    const float* v = x + b * kQuantBlock;
    // the largest magnitude, NaN passed over (the vector loops' max keeps its second operand on NaN)
    float amax = 0.0f;
    bool nan = false;
    for (int64_t i = 0; i < kQuantBlock; ++i) {
      const float a = std::fabs(v[i]);
      amax = a > amax ? a : amax;
      nan = nan || std::isnan(v[i]);
    }
    if (nan || amax == INFINITY) {  // the row's outputs are NaN
      std::memset(codes, 0, kQuantBlock);
      out.scales[r * out.blocks + b] = std::nanf("");
      out.sums[r * out.blocks + b] = 0.0f;
      continue;
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int64_t i = 0; i < kQuantBlock; ++i) {
      const int q = static_cast<int>(std::nearbyint(v[i] * inv));  // nearest, ties to even
      codes[i] = static_cast<int8_t>(q);
      sum += q;
    }
    out.scales[r * out.blocks + b] = amax / 127.0f;
    out.sums[r * out.blocks + b] = static_cast<float>(sum);
  }
}

// Code i (0..31) of column `col` in a packed block.
inline int PackedCode(const PackedQuantizedWeight& w, const uint8_t* block, int64_t col, int64_t i) {
  const int64_t j = i / 4, t = i % 4;
  if (w.bits == 8) return static_cast<int>(block[j * 32 + 4 * col + t]) - 128;
  const uint8_t byte = block[(j % 4) * 32 + 4 * col + t];
  return j < 4 ? byte & 0x0F : byte >> 4;
}

template <typename Scale>
void PortablePanelsOf(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1, int64_t p0,
                      int64_t p1, float* y, int64_t ldy) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t columns = std::min<int64_t>(kColumns, w.n - p * kColumns);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t col = 0; col < columns; ++col) {
        float acc = 0.0f;
        for (int64_t b = 0; b < w.blocks; ++b) {
          const uint8_t* block = w.Block(p, b);
          const Scale* scales = reinterpret_cast<const Scale*>(block + w.code_bytes);
          const int8_t* qx = x.Codes(r, b);
          int32_t dot = 0;
          for (int64_t i = 0; i < kQuantBlock; ++i) dot += PackedCode(w, block, col, i) * qx[i];
          const float s = ToFloat(scales[col]), c = ToFloat(scales[kColumns + col]);
          const float t = std::fma(s, static_cast<float>(dot), c * x.Sums(r)[b]);
          acc = std::fma(x.Scales(r)[b], t, acc);
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

bool CpuHasAvx512Vnni() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return CpuHasAvx2FmaF16c() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

const QuantizedLinearMath* BestMath() {
  static const QuantizedLinearMath* best = [] {
    if (CpuHasAvx512Vnni() && Avx512QuantizedLinearMath() != nullptr) return Avx512QuantizedLinearMath();
    if (CpuHasAvxVnni() && VnniQuantizedLinearMath() != nullptr) return VnniQuantizedLinearMath();
    if (CpuHasAvx2FmaF16c() && Avx2QuantizedLinearMath() != nullptr) return Avx2QuantizedLinearMath();
    return &kPortableQuantizedLinearMath;
  }();
  return best;
}

std::atomic<const QuantizedLinearMath*> forced_math{nullptr};

}  // namespace

const QuantizedLinearMath kPortableQuantizedLinearMath = {PortableQuantizeRow, PortablePanels, "portable"};

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
  if (std::strcmp(name, "avx512-vnni") == 0 && CpuHasAvx512Vnni()) chosen = Avx512QuantizedLinearMath();
  if (chosen == nullptr) return false;
  forced_math.store(chosen, std::memory_order_relaxed);
  return true;
}

// ---- the operator -------------------------------------------------------------------------------

namespace {

struct RowsScratchTag {};
struct PreparedRowTag {};
const char* const kNotConstant =
    " must be a constant initializer (the weight is repacked once, when the session is created)";

}  // namespace

QuantizedLinear::QuantizedLinear(const KernelInfo& info) {
  const int64_t k = info.Int("K"), n = info.Int("N"), bits = info.Int("bits");
  const int64_t activation = info.Int("activation", 0);
  Require(activation == 0 || activation == 1, "activation must be 0 (none) or 1 (swiglu), got " +
                                                  std::to_string(activation));
  swiglu_ = activation == 1;
  epsilon_ = info.Float("epsilon", 1e-5f);
  Require(std::isfinite(epsilon_) && epsilon_ >= 0.0f, "epsilon must be finite and >= 0");
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
  const Tensor x = call.Input(0), skip = call.Input(5), gamma = call.Input(6);
  const int64_t k = weight_.k, width = swiglu_ ? 2 * k : k;  // x's columns
  Require(x.present() && x.type == kFloat, std::string("x must be float32, got ") + ElementTypeName(x.type));
  Require(x.rank() >= 1 && x.dim(x.rank() - 1) == width,
          "x " + x.ShapeText() + " must have " + (swiglu_ ? "2K = " : "K = ") + std::to_string(width) +
              " as its last dimension");
  const bool norm = gamma.present();
  Require(norm || call.OutputCount() < 2, "the sum output needs gamma (it is the RMSNorm's residual sum)");
  if (norm) {
    Require(!swiglu_, "gamma (RMSNorm) and activation swiglu cannot be combined");
    Require(gamma.type == kFloat && gamma.rank() == 1 && gamma.dim(0) == k,
            "gamma " + gamma.ShapeText() + " must be float32 [K] = [" + std::to_string(k) + "]");
  }
  if (skip.present()) {
    Require(norm, "skip needs gamma (it is added before the RMSNorm)");
    Require(skip.type == kFloat && skip.shape == x.shape, "skip " + skip.ShapeText() + " must have x's shape " +
                                                              x.ShapeText());
  }
  Shape out_shape = x.shape;
  out_shape[out_shape.size() - 1] = weight_.n;
  Tensor y = call.Output(0, out_shape);
  // the residual sum x + skip (x itself without skip), when the node asks for it
  Tensor sum = norm ? call.OptionalOutput(1, x.shape) : Tensor{};
  const int64_t rows = x.elements() / width;
  if (rows == 0) return;
  const QuantizedLinearMath& math = SelectQuantizedLinearMath();
  const RowMath& row_math = SelectRowMath();

  // The quantized activations live in the calling thread's scratch: the workers read them while
  // this thread waits in ParallelFor.
  QuantizedRows q;
  q.rows = rows;
  q.blocks = weight_.blocks;
  q.codes = ThreadScratch<RowsScratchTag, int8_t>(static_cast<size_t>(rows * q.blocks * kQuantBlock));
  float* floats = ThreadScratch<RowsScratchTag, float>(static_cast<size_t>(rows * q.blocks * 2));
  q.scales = floats;
  q.sums = floats + rows * q.blocks;
  const float* in = x.as<float>();
  const float* residual = skip.present() ? skip.as<float>() : nullptr;
  const float* weight = norm ? gamma.as<float>() : nullptr;
  float* total = sum.present() ? sum.as<float>() : nullptr;
  const float eps = epsilon_;
  const bool swiglu = swiglu_;
  // Row r's linear input (normed, activated or x itself), quantized.
  auto prepare = [&](int64_t r) {
    const float* row = in + r * width;
    if (norm || swiglu) {
      float* prepared = ThreadScratch<PreparedRowTag>(static_cast<size_t>(k));
      if (norm)
        row_math.rms_norm(row, residual ? residual + r * k : nullptr, weight, k, eps, prepared,
                          total ? total + r * k : nullptr);
      else
        row_math.swiglu(row, row + k, k, prepared);
      row = prepared;
    }
    math.quantize_row(row, r, q);
  };
  constexpr int64_t kPrepareRows = 16;  // rows per task when preparing many rows
  if (rows <= kPrepareRows) {
    for (int64_t r = 0; r < rows; ++r) prepare(r);
  } else {
    call.ParallelFor(static_cast<size_t>((rows + kPrepareRows - 1) / kPrepareRows), [&](size_t t) {
      const int64_t r0 = static_cast<int64_t>(t) * kPrepareRows;
      for (int64_t r = r0; r < std::min(rows, r0 + kPrepareRows); ++r) prepare(r);
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
