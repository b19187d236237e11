// OgaTensor: an n-dimensional array crossing the C API (Generator logits, as in onnxruntime-genai
// 0.18). It either borrows the caller's buffer (OgaCreateTensorFromBuffer with data) or owns its
// storage (data NULL, or tensors the API returns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oga/oga.h"

struct OgaTensor {
  std::vector<int64_t> shape;
  OgaElementType type = OgaElementType_undefined;
  void* data = nullptr;        // the elements: owned.data() or the caller's buffer
  std::vector<uint8_t> owned;  // storage of an owning tensor
};

namespace oga {

// Bytes per element of `type`; 0 for undefined and string.
size_t ElementSize(OgaElementType type);
// Number of elements of `shape` (1 for rank 0).
size_t ElementCount(const std::vector<int64_t>& shape);

}  // namespace oga
