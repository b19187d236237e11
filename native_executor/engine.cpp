#include "engine.h"

#include <cstdlib>

namespace native {

std::string DimensionMismatch(const Model& model, const std::string& tensor, int axis, int64_t dim,
                              const std::string& source) {
  return model.path + ": " + tensor + " dimension " + std::to_string(axis) + " is " + std::to_string(dim) +
         " in the graph, but " + source + ".";
}

OgaExtExecutionStatus RunFailure(const OrtApi* api, OrtStatus* status, std::string* message) {
  const char* reason = Entry<const char* (*)(const OrtStatus*)>(api, kGetErrorMessage)(status);
  *message = std::string("RuntimeError: Error in execution: ") + (reason ? reason : "");
  Entry<void (*)(OrtStatus*)>(api, kReleaseStatus)(status);
  return ClassifyFailure(*message);
}

void* AllocateZeroed(size_t bytes) { return std::calloc(1, bytes ? bytes : 1); }

}  // namespace native
