/*
 * quantized_linear.h -- oga.QuantizedLinear: y = x . W^T for a block-quantized weight W [N, K] given
 * in com.microsoft.MatMulNBits' layout (what oga's builder writes from GGUF Q4_0 / Q4_1 / Q8_0
 * blocks and from round-to-nearest quantization, and what onnxruntime-genai's builder writes), with
 * GGUF Q4_1's per-block offsets as one more input:
 *
 *   0 x              float [..., K] (with activation swiglu: [..., 2K], gate then up)
 *   1 codes          uint8 [N, K / block_size, block_size * bits / 8]   (MatMulNBits' B)
 *   2 scales         float [N * K / block_size]
 *   3 zero_points    uint8 (optional) 4-bit: [N * ceil(blocks / 2)], two a byte, low nibble first;
 *                    8-bit: [N * blocks]; absent: 2^(bits-1)
 *   4 block_offsets  float16 [K / 32, N] (optional) c, added to every value of its block
 *   5 skip           float [..., K] (optional, with 6) the residual stream
 *   6 gamma          float [K] (optional) RMSNorm's weight: the linear reads RMSNorm(x + skip) * gamma
 *
 *   0 y              float [..., N]
 *   1 sum            float [..., K] (optional, with 6) x + skip: the next residual
 *
 * Attributes: K, N, bits (4 or 8), block_size (a multiple of 32); epsilon (RMSNorm's, default 1e-5);
 * activation (0: none, the default; 1: swiglu, the linear reads SiLU(gate) * up). With gamma the node
 * is oga.SkipRMSNorm and the linear in one, with swiglu oga.SwiGlu and the linear: the same row loops
 * (row_math.h) feed the activation quantization directly, so the graph computes the same bits with
 * fewer nodes and no intermediate tensor. Every value of W is
 * w = (q - z) * s (+ c). Inputs 1-4 must be constant initializers: the weight is repacked once, when
 * the session creates the kernel, into panels of kColumns output columns (PackedQuantizedWeight), and
 * the initializers are not read again.
 *
 * The activations are quantized to int8 per block of 32 values, as llama.cpp's Q8 activations and
 * MatMulNBits' accuracy_level 4 do: dx = max|x| / 127, qx = round(x * (127 / max|x|)) (a block
 * holding an infinity or NaN gets dx = NaN and codes 0: its row's outputs are NaN). Each output is
 * then, over the blocks b of K in ascending order,
 *
 *     acc = fma(dx_b, fma(s_b, D_b, c'_b * S_b), acc)     acc starting at 0
 *
 * with D_b = sum q * qx over the block (an exact integer), S_b = sum qx, s_b the scale and
 * c'_b = c_b - s_b * z_b (the zero point folded into the offset once, at packing). Every path (the
 * portable loops, AVX2, AVX-VNNI, AVX512-VNNI; one row or a tile of rows; any thread split) computes exactly these
 * operations in this order, so a row's outputs are the same bits alone, in any batch and on any of
 * these CPUs' code paths. (With gamma or swiglu, the row loops before the quantization are
 * row_math.h's: batch-invariant too, but its portable and AVX2 versions agree only to float32
 * rounding.)
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
 * The repacked weight. Column panel p holds output columns 8p .. 8p+7 (zero-padded past N); block b
 * (32 values along K) of panel p is `block_bytes` bytes at data + (p * blocks + b) * block_bytes:
 *
 *   codes    32-byte vectors whose 32-bit lane c holds 4 neighbouring codes of column c, so one
 *            vpdpbusd against 4 activation codes broadcast to every lane adds 4 products to each of
 *            the 8 columns' sums (no horizontal reduction):
 *            4-bit: 4 vectors; byte 4c + t of vector j = q[c][4j + t] | q[c][16 + 4j + t] << 4
 *            8-bit: 8 vectors; byte 4c + t of vector j = q[c][4j + t] (MatMulNBits' unsigned code)
 *   scales   s[8 columns] then c'[8 columns], float16 when every one of the weight's is exact in
 *            float16 (GGUF scales are float16), else float32
 *
 * so a panel streams in one pass. The 8-bit codes are kept unsigned; D and c' are those of the
 * signed codes q - 128 (D = sum (q - 128) * qx, exact in every path).
 */
struct PackedQuantizedWeight {
  int bits = 0;
  bool half_scales = false;
  int64_t n = 0, k = 0;
  int64_t panels = 0, blocks = 0;
  int64_t code_bytes = 0;    // per block of 8 columns: 128 (4-bit) or 256 (8-bit)
  int64_t block_bytes = 0;   // codes + scales
  const uint8_t* Block(int64_t panel, int64_t block) const {
    return data.get() + (static_cast<size_t>(panel) * static_cast<size_t>(blocks) + static_cast<size_t>(block)) *
                            static_cast<size_t>(block_bytes);
  }
  int64_t bytes() const { return panels * blocks * block_bytes; }

  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data;
};

/*
 * Activations quantized for the loops: per row and block, 32 int8 codes qx in K order, dx (float)
 * and S = sum qx (as float, exact).
 */
struct QuantizedRows {
  int64_t rows = 0, blocks = 0;
  int8_t* codes = nullptr;   // [rows][blocks][32]
  float* scales = nullptr;   // [rows][blocks]: dx
  float* sums = nullptr;     // [rows][blocks]: S
  const int8_t* Codes(int64_t r, int64_t block) const { return codes + (r * blocks + block) * kQuantBlock; }
  const float* Scales(int64_t r) const { return scales + r * blocks; }
  const float* Sums(int64_t r) const { return sums + r * blocks; }
};

// The loops, one set per CPU feature level.
struct QuantizedLinearMath {
  // Quantizes one row (out.blocks * 32 values) into row r of `out`.
  void (*quantize_row)(const float* x, int64_t r, const QuantizedRows& out);
  // y[r][8p + j] for rows [r0, r1) and panels [p0, p1), row r of y at y + r * ldy, only columns < n.
  void (*panels)(const PackedQuantizedWeight& w, const QuantizedRows& x, int64_t r0, int64_t r1, int64_t p0,
                 int64_t p1, float* y, int64_t ldy);
  const char* name;
};

extern const QuantizedLinearMath kPortableQuantizedLinearMath;
const QuantizedLinearMath* Avx2QuantizedLinearMath();  // NULL when this build has none
const QuantizedLinearMath* VnniQuantizedLinearMath();  // AVX-VNNI; NULL when this build has none
const QuantizedLinearMath* Avx512QuantizedLinearMath();  // AVX512-VNNI; NULL when this build has none
// The loops in use: the forced ones (SetQuantizedLinearMath), the portable ones when
// PortableForced(), else the best this CPU runs.
const QuantizedLinearMath& SelectQuantizedLinearMath();
// Forces loops by name ("portable", "avx2", "avx-vnni", "avx512-vnni"); NULL or "" lets the CPU decide. False (and
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
  static constexpr size_t kNumInputs = 7;
  static const OutputSpec kOutputs[];
  static constexpr size_t kNumOutputs = 2;

  explicit QuantizedLinear(const KernelInfo& info);
  void Compute(KernelCall& call);

 private:
  PackedQuantizedWeight weight_;
  bool has_zero_points_ = false, has_offsets_ = false;
  bool swiglu_ = false;
  float epsilon_ = 1e-5f;
};

}  // namespace ortops

#endif  // OGA_ORTOPS_QUANTIZED_LINEAR_H_
