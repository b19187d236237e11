/*
 * row_math.h -- per-row loops of the fused norm, activation and block-offset operators: RMSNorm
 * with a residual add, SiLU(gate) * up, and the per-block offsets of a block-quantized weight.
 *
 * Block offsets: a weight stored as w = (q - z) * s + c (c one float per block of 32 along k; GGUF
 * Q4_1's m) contributes, beyond what MatMulNBits computes from (q - z) * s,
 *     y[r, j] += sum_b blocksum(x[r], b) * C[b, j],   blocksum(x, b) = sum of x[32b .. 32b+31]
 * with C [k / 32, n] stored as fp16 (the values are fp16 in the source).
 *
 * SelectRowMath() picks AVX2/FMA/F16C versions when the CPU has them, the portable ones otherwise.
 */
#ifndef OGA_ORTOPS_ROW_MATH_H_
#define OGA_ORTOPS_ROW_MATH_H_

#include <cstddef>
#include <cstdint>

namespace ortops {

constexpr int64_t kOffsetBlock = 32;

struct RowMath {
  // sum = x (+ residual if not NULL); normed = sum / sqrt(mean(sum^2) + eps) * weight. `sum` may be
  // NULL (not wanted); any output may alias x.
  void (*rms_norm)(const float* x, const float* residual, const float* weight, int64_t n, float eps, float* normed,
                   float* sum);
  // out[i] = gate[i] * sigmoid(gate[i]) * up[i]
  void (*swiglu)(const float* gate, const float* up, int64_t n, float* out);
  // y[j] += sum_b blocksum(x, b) * C[b * n + j] for j < n, b < k / 32 (C fp16 bits).
  void (*add_block_offsets)(const float* x, int64_t k, const uint16_t* C, int64_t n, float* y);
  const char* name;
};

const RowMath& SelectRowMath();
extern const RowMath kPortableRowMath;
const RowMath* Avx2RowMath();  // NULL when this build has none

}  // namespace ortops

#endif  // OGA_ORTOPS_ROW_MATH_H_
