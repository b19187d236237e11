/*
 * ort_api.h -- the part of ONNX Runtime's C API that oga's operator library uses.
 *
 * No registry this project can reach ships ONNX Runtime's C headers, so the few entries the
 * operators need are declared here from ORT's documented C API. That API is ABI-stable: the
 * function table (OrtApi) only grows at its end and entries never move, so an entry is addressed
 * by its slot index, and an operator built against these declarations runs on every runtime from
 * kMinimumApiVersion on. The library asks for exactly that version at registration, so an older
 * runtime refuses it cleanly instead of calling past the end of its table.
 *
 * The slot indices below were counted from ORT's published header. Every one but
 * ReleaseCustomOpDomain (called only when registration itself fails) is exercised by
 * tests/test_ort_operators.py: a wrong slot calls the wrong function and the tests fail.
 */
#ifndef OGA_ORTOPS_ORT_API_H_
#define OGA_ORTOPS_ORT_API_H_

#include <cstddef>
#include <cstdint>

namespace ortapi {

// Opaque ORT handles: only ever held by pointer.
struct OrtStatus;
struct OrtApi;  // the function table: an array of pointer-sized slots, see Entry()
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtValue;
struct OrtTensorTypeAndShapeInfo;
struct OrtShapeInferContext;

struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};

// CreateKernelV2 / KernelComputeV2 (16) and KernelContext_ParallelFor (17).
constexpr uint32_t kMinimumApiVersion = 17;

enum ErrorCode : int {
  kOk = 0,
  kFail = 1,
  kInvalidArgument = 2,
};

enum ElementType : int {
  kUndefined = 0,
  kFloat = 1,
  kUint8 = 2,
  kInt8 = 3,
  kInt32 = 6,
  kInt64 = 7,
  kFloat16 = 10,
};

enum InputOutputCharacteristic : int {
  kRequired = 0,
  kOptional = 1,
};

enum MemType : int {
  kMemTypeDefault = 0,
};

// The operator descriptor ORT reads (field order and types are ORT's ABI). ORT reads a member only
// when `version` is at least the API version that introduced it; oga's operators set version
// kMinimumApiVersion, so the members after GetEndVersion are never read (kept zero).
struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info);
  const char* (*GetName)(const OrtCustomOp* op);
  const char* (*GetExecutionProviderType)(const OrtCustomOp* op);  // NULL: the CPU provider
  ElementType (*GetInputType)(const OrtCustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const OrtCustomOp* op);
  ElementType (*GetOutputType)(const OrtCustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const OrtCustomOp* op);
  void (*KernelCompute)(void* kernel, OrtKernelContext* context);
  void (*KernelDestroy)(void* kernel);
  InputOutputCharacteristic (*GetInputCharacteristic)(const OrtCustomOp* op, size_t index);
  InputOutputCharacteristic (*GetOutputCharacteristic)(const OrtCustomOp* op, size_t index);
  MemType (*GetInputMemoryType)(const OrtCustomOp* op, size_t index);
  int (*GetVariadicInputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp* op);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp* op);
  OrtStatus* (*CreateKernelV2)(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                               void** kernel);
  OrtStatus* (*KernelComputeV2)(void* kernel, OrtKernelContext* context);
  OrtStatus* (*InferOutputShapeFn)(const OrtCustomOp* op, OrtShapeInferContext* context);
  int (*GetStartVersion)(const OrtCustomOp* op);
  int (*GetEndVersion)(const OrtCustomOp* op);
  size_t (*GetMayInplace)(int** input_index, int** output_index);
  void (*ReleaseMayInplace)(int* input_index, int* output_index);
  size_t (*GetAliasMap)(int** input_index, int** output_index);
  void (*ReleaseAliasMap)(int* input_index, int* output_index);
};

// OrtApi slots: index, then the signature of the function stored there.
enum Slot : size_t {
  kCreateStatus = 0,                   // OrtStatus* (int code, const char* message)
  kGetErrorCode = 1,                   // int (const OrtStatus*)
  kGetErrorMessage = 2,                // const char* (const OrtStatus*)
  kCreateCustomOpDomain = 26,          // OrtStatus* (const char* domain, OrtCustomOpDomain** out)
  kCustomOpDomainAdd = 27,             // OrtStatus* (OrtCustomOpDomain*, const OrtCustomOp*)
  kAddCustomOpDomain = 28,             // OrtStatus* (OrtSessionOptions*, OrtCustomOpDomain*)
  kGetTensorMutableData = 51,          // OrtStatus* (OrtValue*, void** out)
  kGetTensorElementType = 60,          // OrtStatus* (const OrtTensorTypeAndShapeInfo*, int* out)
  kGetDimensionsCount = 61,            // OrtStatus* (const OrtTensorTypeAndShapeInfo*, size_t* out)
  kGetDimensions = 62,                 // OrtStatus* (const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)
  kGetTensorTypeAndShape = 65,         // OrtStatus* (const OrtValue*, OrtTensorTypeAndShapeInfo** out)
  kKernelInfoGetAttributeFloat = 85,   // OrtStatus* (const OrtKernelInfo*, const char*, float* out)
  kKernelInfoGetAttributeInt64 = 86,   // OrtStatus* (const OrtKernelInfo*, const char*, int64_t* out)
  kKernelContextGetInputCount = 88,    // OrtStatus* (const OrtKernelContext*, size_t* out)
  kKernelContextGetOutputCount = 89,   // OrtStatus* (const OrtKernelContext*, size_t* out)
  kKernelContextGetInput = 90,         // OrtStatus* (const OrtKernelContext*, size_t, const OrtValue** out)
  kKernelContextGetOutput = 91,        // OrtStatus* (OrtKernelContext*, size_t, const int64_t* dims,
                                       //             size_t dim_count, OrtValue** out)
  kReleaseStatus = 93,                 // void (OrtStatus*)
  kReleaseTensorTypeAndShapeInfo = 99, // void (OrtTensorTypeAndShapeInfo*)
  kReleaseCustomOpDomain = 101,        // void (OrtCustomOpDomain*)
  kKernelInfoGetNodeName = 244,        // OrtStatus* (const OrtKernelInfo*, char* out, size_t* size)
  kKernelInfoGetConstantInput = 249,   // OrtStatus* (const OrtKernelInfo*, size_t, int* is_constant,
                                       //             const OrtValue** out)  (KernelInfoGetConstantInput_tensor)
  kKernelContextParallelFor = 274,     // OrtStatus* (const OrtKernelContext*, void (*fn)(void*, size_t),
                                       //             size_t total, size_t num_batch, void* user_data)
};

// The function in slot `slot` of the table, typed as Fn.
template <typename Fn>
inline Fn Entry(const OrtApi* api, Slot slot) {
  return reinterpret_cast<Fn>(reinterpret_cast<void* const*>(api)[slot]);
}

}  // namespace ortapi

#endif  // OGA_ORTOPS_ORT_API_H_
