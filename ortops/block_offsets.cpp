#include "block_offsets.h"

#include <string>

namespace ortops {

BlockOffsets::BlockOffsets(const KernelCall& call, size_t input_index, int64_t rows, int64_t columns) {
  Tensor x = call.Input(input_index), weights = call.Input(input_index + 1);
  if (!x.present() && !weights.present()) return;
  Require(x.present() && weights.present(), "offset_input and offset_weights come together");
  RequireTensor(x, "offset_input", ortapi::kFloat, 2);
  RequireTensor(weights, "offset_weights", ortapi::kFloat16, 2);
  Require(x.dim(0) == rows, "offset_input " + x.ShapeText() + " must have " + std::to_string(rows) + " rows");
  Require(x.dim(1) % kOffsetBlock == 0 && weights.dim(0) == x.dim(1) / kOffsetBlock && weights.dim(1) == columns,
          "offset_weights " + weights.ShapeText() + " must be [" + std::to_string(x.dim(1) / kOffsetBlock) + ", " +
              std::to_string(columns) + "] for offset_input " + x.ShapeText() + " (blocks of 32)");
  x_ = x.as<float>();
  weights_ = weights.as<uint16_t>();
  k_ = x.dim(1);
  columns_ = columns;
  math_ = &SelectRowMath();
}

}  // namespace ortops
