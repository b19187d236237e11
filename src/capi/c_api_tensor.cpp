// C API: OgaTensor (tensor_handle.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "capi/c_api_support.h"
#include "compat/tensor_handle.h"

using oga::ApiError;
using oga::Guard;
using oga::RequireNotNull;

namespace oga {

size_t ElementSize(OgaElementType type) {
  switch (type) {
    case OgaElementType_float32:
    case OgaElementType_int32:
    case OgaElementType_uint32:
      return 4;
    case OgaElementType_uint8:
    case OgaElementType_int8:
    case OgaElementType_bool:
      return 1;
    case OgaElementType_uint16:
    case OgaElementType_int16:
    case OgaElementType_float16:
      return 2;
    case OgaElementType_int64:
    case OgaElementType_float64:
    case OgaElementType_uint64:
      return 8;
    default:
      return 0;
  }
}

size_t ElementCount(const std::vector<int64_t>& shape) {
  size_t count = 1;
  for (int64_t dim : shape) count *= static_cast<size_t>(dim);
  return count;
}

}  // namespace oga

OgaResult* OGA_API_CALL OgaCreateTensorFromBuffer(void* data, const int64_t* shape_dims, size_t shape_dims_count,
                                                  OgaElementType element_type, OgaTensor** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(out, "out must not be null.");
    if (shape_dims == nullptr && shape_dims_count != 0) throw ApiError("shape_dims must not be null.");
    const size_t element_size = oga::ElementSize(element_type);
    if (element_size == 0) throw ApiError("Unsupported tensor element type " + std::to_string(element_type) + ".");
    auto tensor = std::make_unique<OgaTensor>();
    tensor->type = element_type;
    size_t count = 1;
    for (size_t i = 0; i < shape_dims_count; ++i) {
      if (shape_dims[i] < 0) throw ApiError("Tensor dimensions must not be negative.");
      const size_t dim = static_cast<size_t>(shape_dims[i]);
      if (dim != 0 && count > (SIZE_MAX / element_size) / dim) throw ApiError("The tensor is too large.");
      count *= dim;
      tensor->shape.push_back(shape_dims[i]);
    }
    if (data == nullptr) {
      tensor->owned.assign(count * element_size, 0);
      tensor->data = tensor->owned.data();
    } else {
      tensor->data = data;  // borrowed: the caller keeps it alive as long as the tensor
    }
    *out = tensor.release();
  });
}

OgaResult* OGA_API_CALL OgaTensorGetType(OgaTensor* tensor, OgaElementType* out) {
  return Guard([&] {
    RequireNotNull(tensor, "tensor must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = tensor->type;
  });
}

OgaResult* OGA_API_CALL OgaTensorGetShapeRank(OgaTensor* tensor, size_t* out) {
  return Guard([&] {
    RequireNotNull(tensor, "tensor must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = tensor->shape.size();
  });
}

OgaResult* OGA_API_CALL OgaTensorGetShape(OgaTensor* tensor, int64_t* shape_dims, size_t shape_dims_count) {
  return Guard([&] {
    RequireNotNull(tensor, "tensor must not be null.");
    if (shape_dims_count != tensor->shape.size()) {
      throw ApiError("shape_dims_count (" + std::to_string(shape_dims_count) + ") must equal the tensor's rank (" +
                     std::to_string(tensor->shape.size()) + ").");
    }
    if (shape_dims_count != 0) RequireNotNull(shape_dims, "shape_dims must not be null.");
    std::copy(tensor->shape.begin(), tensor->shape.end(), shape_dims);
  });
}

OgaResult* OGA_API_CALL OgaTensorGetData(OgaTensor* tensor, void** out) {
  return Guard([&] {
    RequireNotNull(tensor, "tensor must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = tensor->data;
  });
}

void OGA_API_CALL OgaDestroyTensor(OgaTensor* tensor) { delete tensor; }
