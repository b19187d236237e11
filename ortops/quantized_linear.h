/*
 * quantized_linear.h -- oga.QuantizedLinear: y = x . W^T for a block-quantized weight W [N, K] given
 * in com.microsoft.MatMulNBits' layout (what oga's builder writes from GGUF Q4_0 / Q4_1 / Q8_0
 * blocks and from round-to-nearest quantization, and what onnxruntime-genai's builder writes), with
 * GGUF Q4_1's per-block offsets as one more input:
 *
 *   0 x              float [..., K]
 *   1 codes          uint8 [N, K / block_size, block_size * bits / 8]   (MatMulNBits' B)
 *   2 scales         float [N * K / block_size]
 *   3 zero_points    uint8 (optional) 4-bit: [N * ceil(blocks / 2)], two a byte, low nibble first;
 *                    8-bit: [N * blocks]; absent: 2^(bits-1)
 *   4 block_offsets  float16 [K / 32, N] (optional) c, added to every value of its block
 *
 *   0 y              float [..., N]
 *
 * Attributes: K, N, bits (4 or 8), block_size (a multiple of 32). Every value of W is
 * w = (q - z) * s (+ c). Inputs 1-4 must be constant initializers: the weight is repacked once, when
 * the session creates the kernel, into panels of kColumns output columns (PackedQuantizedWeight), and
 * the initializers are not read again.
 *
 * The activations are quantized to int8 per block of 32 values, as llama.cpp's Q8 activations and
 * MatMulNBits' accuracy_level 4 do: dx = max|x| / 127, qx = round(x / dx) (a block holding NaN gets
 * dx = NaN). Each output is then, over the blocks b of K in ascending order,
 *
 *     acc = fma(dx_b, fma(s_b, D_b, c'_b * S_b), acc)     acc starting at 0
 *
 * with D_b = sum q * qx over the block (an exact integer), S_b = sum qx, s_b the scale and
 * c'_b = c_b - s_b * z_b (the zero point folded into the offset once, at packing). Every path (the
 * portable loops, AVX2, AVX-VNNI; one row or a tile of rows; any thread split) computes exactly these
 * operations in this order, so a row's outputs are the same bits alone, in any batch and on any of
 * these CPUs' code paths.
 */
#ifndef OGA_ORTOPS_QUANTIZED_LINEAR_H_
#define OGA_ORTOPS_QUANTIZED_LINEAR_H_

#include <cstdint>
#include <cstdlib>
#include <memory>

#include "half.h"
#include "op_kernel.h"

namespace ortops {

constexpr int64_t kQuantBlock = 32;   // values per quantization block, weights and activations
constexpr int64_t kColumns = 8;       // output columns per panel: one 8-lane vector of sums

/*
 * The repacked weight. Column panel p holds output columns 8p .. 8p+7 (zero-padded past N) and K in
 * pairs of blocks (a zero block pads an odd count); pair j of panel p is `pair_bytes` bytes at
 * data + (p * pairs + j) * pair_bytes:
 *
 *   codes    for each of the 8 columns: 4-bit: 32 bytes, byte i = q[b][i] | q[b][16+i] << 4 for
 *            bytes 0..15 (block b = 2j) and the same of block b+1 in bytes 16..31;
 *            8-bit: 64 bytes of int8 q - 128: block b values 0..15, block b+1 values 0..15,
 *            block b values 16..31, block b+1 values 16..31
 *   scales   s[b][8 columns], c'[b][8], s[b+1][8], c'[b+1][8], float16 when every one of the weight's
 *            is exact in float16 (GGUF scales are float16), else float32
 *
 * so a panel streams in one pass, and 32 bytes of codes meet one 32-byte vector of activations.
 */
struct PackedQuantizedWeight {
  int bits = 0;
  bool half_scales = false;
  int64_t n = 0, k = 0;
  int64_t panels = 0, pairs = 0;
  int64_t code_bytes = 0;    // per column and pair: 32 (4-bit) or 64 (8-bit)
  int64_t pair_bytes = 0;    // codes of 8 columns + their scales
  const uint8_t* Pair(int64_t panel, int64_t pair) const {
    return data.get() + (static_cast<size_t>(panel) * static_cast<size_t>(pairs) + static_cast<size_t>(pair)) *
                            static_cast<size_t>(pair_bytes);
  }
  int64_t bytes() const { return panels * pairs * pair_bytes; }

  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data;
};

/*
 * Activations quantized for the loops: per row, `pairs` pairs of blocks, each 64 bytes of int8 qx in
 * the order of the 8-bit codes (block b values 0..15, block b+1 values 0..15, b 16..31, b+1 16..31),
 * then per block dx (float) and S = sum qx (as float, exact).
 */
struct QuantizedRows {
  int64_t rows = 0, pairs = 0;
  int8_t* codes = nullptr;   // [rows][pairs][64]
  float* scales = nullptr;   // [rows][pairs * 2]: dx
  float* sums = nullptr;     // [rows][pairs * 2]: S
  const int8_t* Codes(int64_t r, int64_t pair) const { return codes + (r * pairs + pair) * 64; }
  const float* Scales(int64_t r) const { return scales + r * pairs * 2; }
  const float* Sums(int64_t r) const { return sums + r * pairs * 2; }
};

// The loops, one set per CPU feature level.
struct QuantizedLinearMath {
  // Quantizes x rows [r0, r1) (row r at x + r * k) into `out`.
  void (*quantize)(const float* x, int64_t k, int64_t r0, int64_t r1, const QuantizedRows& out);
  // y[r][8p + j] for rows [r0, r1) and panels [p0, p1), row r of y at y + r * ldy, only columns < n.
  void (*panels)(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1, int64_t p0,
                 int64_t p1, float* y, int64_t ldy);
  const char* name;
};

extern const QuantizedLinearMath kPortableQuantizedLinearMath;
const QuantizedLinearMath* Avx2QuantizedLinearMath();  // NULL when this build has none
const QuantizedLinearMath* VnniQuantizedLinearMath();  // AVX-VNNI; NULL when this build has none
// The loops in use: the forced ones (SetQuantizedLinearMath), the portable ones when
// PortableForced(), else the best this CPU runs.
const QuantizedLinearMath& SelectQuantizedLinearMath();
// Forces loops by name ("portable", "avx2", "avx-vnni"); NULL or "" lets the CPU decide. False (and
// nothing changes) for a name this build or CPU cannot run.
bool SetQuantizedLinearMath(const char* name);

// Repacks a MatMulNBits weight (the inputs as described above; zero_points and offsets may be NULL).
// Throws OpError for a shape or block size it cannot hold.
PackedQuantizedWeight PackQuantizedWeight(int bits, int64_t block_size, int64_t n, int64_t k, const uint8_t* codes,
                                          const float* scales, const uint8_t* zero_points, const Half* offsets);

class QuantizedLinear {
 public:
  static constexpr const char* kName = "QuantizedLinear";
  static const InputSpec kInputs[];
  static constexpr size_t kNumInputs = 5;
  static const OutputSpec kOutputs[];
  static constexpr size_t kNumOutputs = 1;

  explicit QuantizedLinear(const KernelInfo& info);
  void Compute(KernelCall& call);

 private:
  PackedQuantizedWeight weight_;
  bool has_zero_points_ = false, has_offsets_ = false;
};

}  // namespace ortops

#endif  // OGA_ORTOPS_QUANTIZED_LINEAR_H_
