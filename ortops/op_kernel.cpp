#include "op_kernel.h"

#include <sstream>

#include "thread_pool.h"

namespace ortops {

using namespace ortapi;

void CheckStatus(const OrtApi* api, OrtStatus* status, const char* what) {
  if (status == nullptr) return;
  const char* text = Entry<const char* (*)(const OrtStatus*)>(api, kGetErrorMessage)(status);
  std::string message = std::string(what) + ": " + text;
  int code = Entry<int (*)(const OrtStatus*)>(api, kGetErrorCode)(status);
  Entry<void (*)(OrtStatus*)>(api, kReleaseStatus)(status);
  throw OpError(message, code == kInvalidArgument ? kInvalidArgument : kFail);
}

const char* ElementTypeName(ElementType type) {
  switch (type) {
    case kFloat: return "float32";
    case kUint8: return "uint8";
    case kInt8: return "int8";
    case kInt32: return "int32";
    case kInt64: return "int64";
    case kFloat16: return "float16";
    case kUndefined: return "absent";
    default: return "another type";
  }
}

int64_t Tensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Tensor::ShapeText() const {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

void RequireTensor(const Tensor& t, const char* name, ElementType type, size_t rank) {
  if (!t.present()) throw OpError(std::string(name) + " is required");
  if (t.type != type)
    throw OpError(std::string(name) + " must be " + ElementTypeName(type) + ", got " + ElementTypeName(t.type));
  if (t.rank() != rank)
    throw OpError(std::string(name) + " must have rank " + std::to_string(rank) + ", got shape " + t.ShapeText());
}

// ---- KernelInfo ---------------------------------------------------------------------------------

bool KernelInfo::TryInt(const char* name, int64_t* out) const {
  OrtStatus* status = Entry<OrtStatus* (*)(const OrtKernelInfo*, const char*, int64_t*)>(
      api_, kKernelInfoGetAttributeInt64)(info_, name, out);
  if (status == nullptr) return true;
  Entry<void (*)(OrtStatus*)>(api_, kReleaseStatus)(status);
  return false;
}

int64_t KernelInfo::Int(const char* name) const {
  int64_t value = 0;
  if (!TryInt(name, &value)) throw OpError(std::string("the integer attribute '") + name + "' is required");
  return value;
}

int64_t KernelInfo::Int(const char* name, int64_t fallback) const {
  int64_t value = 0;
  return TryInt(name, &value) ? value : fallback;
}

float KernelInfo::Float(const char* name, float fallback) const {
  float value = 0;
  OrtStatus* status = Entry<OrtStatus* (*)(const OrtKernelInfo*, const char*, float*)>(
      api_, kKernelInfoGetAttributeFloat)(info_, name, &value);
  if (status == nullptr) return value;
  Entry<void (*)(OrtStatus*)>(api_, kReleaseStatus)(status);
  return fallback;
}

std::string KernelInfo::NodeName() const {
  auto get = Entry<OrtStatus* (*)(const OrtKernelInfo*, char*, size_t*)>(api_, kKernelInfoGetNodeName);
  size_t size = 0;
  CheckStatus(api_, get(info_, nullptr, &size), "KernelInfo_GetNodeName");
  std::string name(size, '\0');
  CheckStatus(api_, get(info_, &name[0], &size), "KernelInfo_GetNodeName");
  while (!name.empty() && name.back() == '\0') name.pop_back();
  return name;
}

// ---- KernelCall ---------------------------------------------------------------------------------

namespace {

Tensor Describe(const OrtApi* api, OrtValue* value) {
  Tensor t;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  CheckStatus(api, Entry<OrtStatus* (*)(const OrtValue*, OrtTensorTypeAndShapeInfo**)>(api, kGetTensorTypeAndShape)(
                       value, &info),
              "GetTensorTypeAndShape");
  auto release = Entry<void (*)(OrtTensorTypeAndShapeInfo*)>(api, kReleaseTensorTypeAndShapeInfo);
  try {
    int type = 0;
    size_t rank = 0;
    CheckStatus(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int*)>(api, kGetTensorElementType)(
                         info, &type),
                "GetTensorElementType");
    CheckStatus(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, size_t*)>(api, kGetDimensionsCount)(
                         info, &rank),
                "GetDimensionsCount");
    t.shape.resize(rank);
    CheckStatus(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)>(api, kGetDimensions)(
                         info, t.shape.data(), rank),
                "GetDimensions");
    t.type = static_cast<ElementType>(type);
  } catch (...) {
    release(info);
    throw;
  }
  release(info);
  CheckStatus(api, Entry<OrtStatus* (*)(OrtValue*, void**)>(api, kGetTensorMutableData)(value, &t.data),
              "GetTensorMutableData");
  return t;
}

}  // namespace

Tensor KernelInfo::ConstantInput(size_t index) const {
  int is_constant = 0;
  const OrtValue* value = nullptr;
  CheckStatus(api_, Entry<OrtStatus* (*)(const OrtKernelInfo*, size_t, int*, const OrtValue**)>(
                        api_, kKernelInfoGetConstantInput)(info_, index, &is_constant, &value),
              "KernelInfoGetConstantInput_tensor");
  if (!is_constant || value == nullptr) return Tensor{};
  return Describe(api_, const_cast<OrtValue*>(value));
}

KernelCall::KernelCall(const OrtApi* api, OrtKernelContext* context) : api_(api), context_(context) {
  CheckStatus(api_, Entry<OrtStatus* (*)(const OrtKernelContext*, size_t*)>(api_, kKernelContextGetInputCount)(
                        context_, &input_count_),
              "KernelContext_GetInputCount");
}

Tensor KernelCall::Input(size_t index) const {
  if (index >= InputCount()) return Tensor{};
  const OrtValue* value = nullptr;
  CheckStatus(api_, Entry<OrtStatus* (*)(const OrtKernelContext*, size_t, const OrtValue**)>(
                        api_, kKernelContextGetInput)(context_, index, &value),
              "KernelContext_GetInput");
  if (value == nullptr) return Tensor{};
  return Describe(api_, const_cast<OrtValue*>(value));
}

Tensor KernelCall::Output(size_t index, const Shape& shape) {
  OrtValue* value = nullptr;
  CheckStatus(api_, Entry<OrtStatus* (*)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**)>(
                        api_, kKernelContextGetOutput)(context_, index, shape.data(), shape.size(), &value),
              "KernelContext_GetOutput");
  if (value == nullptr) throw OpError("output " + std::to_string(index) + " is not available", kFail);
  return Describe(api_, value);
}

size_t KernelCall::OutputCount() const {
  size_t count = 0;
  CheckStatus(api_, Entry<OrtStatus* (*)(const OrtKernelContext*, size_t*)>(api_, kKernelContextGetOutputCount)(
                        context_, &count),
              "KernelContext_GetOutputCount");
  return count;
}

Tensor KernelCall::OptionalOutput(size_t index, const Shape& shape) {
  if (index >= OutputCount()) return Tensor{};
  OrtValue* value = nullptr;
  CheckStatus(api_, Entry<OrtStatus* (*)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**)>(
                        api_, kKernelContextGetOutput)(context_, index, shape.data(), shape.size(), &value),
              "KernelContext_GetOutput");
  return value == nullptr ? Tensor{} : Describe(api_, value);
}

void KernelCall::RunParallel(size_t count, void (*body)(void*, size_t), void* state) {
  if (count == 0) return;
  if (count == 1) {
    body(state, 0);
    return;
  }
  if (ThreadPool* pool = SharedThreadPool()) {
    RunOnPool(pool, count, body, state);
    return;
  }
  CheckStatus(api_, Entry<OrtStatus* (*)(const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t, void*)>(
                        api_, kKernelContextParallelFor)(context_, body, count, 0, state),
              "KernelContext_ParallelFor");
}

}  // namespace ortops
