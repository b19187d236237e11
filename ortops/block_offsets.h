/*
 * block_offsets.h -- the optional (offset_input, offset_weights) input pair of oga's operators that
 * consume a block-quantized linear's output: the part of x @ W^T that MatMulNBits leaves out when W
 * has per-block offsets (w = (q - z) * s + c, GGUF Q4_1; see row_math.h):
 *
 *   offset_input    float [rows, k]            x, the linear's input
 *   offset_weights  float16 [k / 32, n]        C: the offsets, transposed
 *
 * The operator adds blocksums(x[r]) @ C to row r of the linear's output before using it.
 */
#ifndef OGA_ORTOPS_BLOCK_OFFSETS_H_
#define OGA_ORTOPS_BLOCK_OFFSETS_H_

#include <cstring>

#include "op_kernel.h"
#include "row_math.h"

namespace ortops {

class BlockOffsets {
 public:
  // From inputs `input_index` and `input_index + 1` of `call`; absent when the node leaves both out.
  // `rows` and `columns`: the shape of the output the offsets add to.
  BlockOffsets(const KernelCall& call, size_t input_index, int64_t rows, int64_t columns);
  bool present() const { return x_ != nullptr; }
  // Adds the offsets of row r to y (columns floats).
  void AddTo(int64_t r, float* y) const { math_->add_block_offsets(x_ + r * k_, k_, weights_, columns_, y); }
  // Row r of the output with its offsets: y itself when there are none, else `scratch` (columns
  // floats) holding a copy of y with them added. y is never written.
  const float* Corrected(int64_t r, const float* y, float* scratch) const {
    if (!present()) return y;
    std::memcpy(scratch, y, sizeof(float) * columns_);
    AddTo(r, scratch);
    return scratch;
  }

 private:
  const float* x_ = nullptr;
  const uint16_t* weights_ = nullptr;
  int64_t k_ = 0, columns_ = 0;
  const RowMath* math_ = nullptr;
};

}  // namespace ortops

#endif  // OGA_ORTOPS_BLOCK_OFFSETS_H_
