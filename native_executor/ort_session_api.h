/*
 * ort_session_api.h -- the part of ONNX Runtime's C API that oga's native executor uses: the
 * environment, session options, sessions, tensors over caller memory, IOBinding and run.
 *
 * As in ortops/ort_api.h (whose opaque handles, OrtApiBase and element types this header shares),
 * no registry this project can reach ships ONNX Runtime's C headers, so the entries are declared
 * here from ORT's published onnxruntime_c_api.h. OrtApi is an array of function pointers that only
 * grows at its end; an entry is addressed by its slot index. The indices below were counted from
 * that header (struct OrtApi, one slot per ORT_API2_STATUS / ORT_CLASS_RELEASE / plain function
 * member, from CreateStatus = 0), and agree with the anchors ortops/ort_api.h counted
 * independently (CreateCustomOpDomain 26, GetTensorMutableData 51, GetTensorElementType 60,
 * GetDimensions 62, GetTensorTypeAndShape 65, ReleaseStatus 93, ReleaseTensorTypeAndShapeInfo 99).
 *
 * Verification: OgaNativeExecutorCheckApi (native_executor.h) calls every entry whose effect it
 * can observe and checks the effect (a status's code and text, a memory info's name, a tensor's
 * data address, element type and dimensions); the session entries are checked by
 * tests/test_native_executor.py, which compares the native session's input/output names, types
 * and shapes with the Python binding's and runs every decoder the suite builds. A wrong slot calls
 * another function and fails those checks (or crashes them) instead of passing silently. The
 * entries whose effect is not observable from outside (thread counts, log id, optimization level)
 * sit between verified neighbours in the counted table.
 */
#ifndef OGA_NATIVE_EXECUTOR_ORT_SESSION_API_H_
#define OGA_NATIVE_EXECUTOR_ORT_SESSION_API_H_

#include <cstddef>
#include <cstdint>

#include "ort_api.h"  // ortops/: OrtStatus, OrtApi, OrtApiBase, OrtSessionOptions, ElementType

namespace ortsession {

using ortapi::OrtApi;
using ortapi::OrtApiBase;
using ortapi::OrtSessionOptions;
using ortapi::OrtStatus;
using ortapi::OrtTensorTypeAndShapeInfo;
using ortapi::OrtValue;

// Opaque ORT handles the executor holds by pointer.
struct OrtEnv;
struct OrtSession;
struct OrtMemoryInfo;
struct OrtIoBinding;
struct OrtRunOptions;
struct OrtTypeInfo;
struct OrtAllocator;

// Every entry below exists from API version 13 on (the header they were counted from); the
// executor asks for 17, the version oga's operator library (ortops) needs, because the fused
// graphs cannot run on an older runtime anyway.
constexpr uint32_t kApiVersion = 17;

// OrtErrorCode
enum ErrorCode : int {
  kOk = 0, kFail = 1, kInvalidArgument = 2, kNoSuchFile = 3, kNoModel = 4, kEngineError = 5,
  kRuntimeException = 6, kInvalidProtobuf = 7, kModelLoaded = 8, kNotImplemented = 9, kInvalidGraph = 10,
  kEpFail = 11,
};

enum LoggingLevel : int { kLogVerbose = 0, kLogInfo = 1, kLogWarning = 2, kLogError = 3, kLogFatal = 4 };
enum GraphOptimizationLevel : int { kDisableAll = 0, kEnableBasic = 1, kEnableExtended = 2, kEnableAll = 99 };
enum AllocatorType : int { kDeviceAllocator = 0, kArenaAllocator = 1 };
enum MemType : int { kMemTypeDefault = 0 };

// OrtApi slots: index, then the signature of the function stored there.
enum Slot : size_t {
  kCreateStatus = 0,                     // OrtStatus* (int code, const char* message)
  kGetErrorCode = 1,                     // int (const OrtStatus*)
  kGetErrorMessage = 2,                  // const char* (const OrtStatus*)
  kCreateEnv = 3,                        // OrtStatus* (int log_severity_level, const char* logid, OrtEnv** out)
  kCreateSession = 7,                    // OrtStatus* (const OrtEnv*, const char* model_path,
                                         //             const OrtSessionOptions*, OrtSession** out)
  kCreateSessionOptions = 10,            // OrtStatus* (OrtSessionOptions** out)
  kSetSessionLogId = 20,                 // OrtStatus* (OrtSessionOptions*, const char* logid)
  kSetSessionGraphOptimizationLevel = 23,  // OrtStatus* (OrtSessionOptions*, int level)
  kSetIntraOpNumThreads = 24,            // OrtStatus* (OrtSessionOptions*, int intra_op_num_threads)
  kSetInterOpNumThreads = 25,            // OrtStatus* (OrtSessionOptions*, int inter_op_num_threads)
  kRegisterCustomOpsLibrary = 29,        // OrtStatus* (OrtSessionOptions*, const char* library_path,
                                         //             void** library_handle)
  kSessionGetInputCount = 30,            // OrtStatus* (const OrtSession*, size_t* out)
  kSessionGetOutputCount = 31,           // OrtStatus* (const OrtSession*, size_t* out)
  kSessionGetInputTypeInfo = 33,         // OrtStatus* (const OrtSession*, size_t index, OrtTypeInfo** out)
  kSessionGetOutputTypeInfo = 34,        // OrtStatus* (const OrtSession*, size_t index, OrtTypeInfo** out)
  kSessionGetInputName = 36,             // OrtStatus* (const OrtSession*, size_t index, OrtAllocator*, char** out)
  kSessionGetOutputName = 37,            // OrtStatus* (const OrtSession*, size_t index, OrtAllocator*, char** out)
  kCreateTensorWithDataAsOrtValue = 49,  // OrtStatus* (const OrtMemoryInfo*, void* data, size_t data_bytes,
                                         //             const int64_t* shape, size_t shape_len, int type,
                                         //             OrtValue** out)
  kGetTensorMutableData = 51,            // OrtStatus* (OrtValue*, void** out)
  kCastTypeInfoToTensorInfo = 55,        // OrtStatus* (const OrtTypeInfo*, const OrtTensorTypeAndShapeInfo** out)
  kGetTensorElementType = 60,            // OrtStatus* (const OrtTensorTypeAndShapeInfo*, int* out)
  kGetDimensionsCount = 61,              // OrtStatus* (const OrtTensorTypeAndShapeInfo*, size_t* out)
  kGetDimensions = 62,                   // OrtStatus* (const OrtTensorTypeAndShapeInfo*, int64_t* out, size_t)
  kGetSymbolicDimensions = 63,           // OrtStatus* (const OrtTensorTypeAndShapeInfo*, const char* dim_params[],
                                         //             size_t dim_params_length)
  kGetTensorTypeAndShape = 65,           // OrtStatus* (const OrtValue*, OrtTensorTypeAndShapeInfo** out)
  kCreateCpuMemoryInfo = 69,             // OrtStatus* (int allocator_type, int mem_type, OrtMemoryInfo** out)
  kMemoryInfoGetName = 71,               // OrtStatus* (const OrtMemoryInfo*, const char** out)
  kAllocatorFree = 76,                   // OrtStatus* (OrtAllocator*, void* p)
  kGetAllocatorWithDefaultOptions = 78,  // OrtStatus* (OrtAllocator** out)
  kReleaseEnv = 92,                      // void (OrtEnv*)
  kReleaseStatus = 93,                   // void (OrtStatus*)
  kReleaseMemoryInfo = 94,               // void (OrtMemoryInfo*)
  kReleaseSession = 95,                  // void (OrtSession*)
  kReleaseValue = 96,                    // void (OrtValue*)
  kReleaseTypeInfo = 98,                 // void (OrtTypeInfo*)
  kReleaseTensorTypeAndShapeInfo = 99,   // void (OrtTensorTypeAndShapeInfo*)
  kReleaseSessionOptions = 100,          // void (OrtSessionOptions*)
  kAddSessionConfigEntry = 130,          // OrtStatus* (OrtSessionOptions*, const char* key, const char* value)
  kRunWithBinding = 133,                 // OrtStatus* (OrtSession*, const OrtRunOptions* (NULL: defaults),
                                         //             const OrtIoBinding*)
  kCreateIoBinding = 134,                // OrtStatus* (OrtSession*, OrtIoBinding** out)
  kReleaseIoBinding = 135,               // void (OrtIoBinding*)
  kBindInput = 136,                      // OrtStatus* (OrtIoBinding*, const char* name, const OrtValue*)
  kBindOutput = 137,                     // OrtStatus* (OrtIoBinding*, const char* name, const OrtValue*)
};

// The function in slot `slot` of the table, typed as Fn.
template <typename Fn>
inline Fn Entry(const OrtApi* api, Slot slot) {
  return reinterpret_cast<Fn>(reinterpret_cast<void* const*>(api)[slot]);
}

}  // namespace ortsession

#endif  // OGA_NATIVE_EXECUTOR_ORT_SESSION_API_H_
