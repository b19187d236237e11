// The library's exported functions (native_executor.h) and the executor table's callbacks, which
// turn every exception into a status and a message: nothing thrown crosses into the core.
#include <new>
#include <stdexcept>
#include <string>

#include "engine.h"
#include "model.h"
#include "native_executor.h"
#include "runtime.h"

using namespace native;

namespace {

OgaExtExecutionStatus Failure(const std::exception& error, char* message, size_t capacity) {
  WriteMessage(message, capacity, error.what());
  return ClassifyFailure(error.what());
}

OgaExtExecutionStatus OpenEngine(void* model_data, const OgaExtEngineGeometry* geometry, void** engine_data,
                                 char* message, size_t capacity) {
  Model* model = static_cast<Model*>(model_data);
  try {
    OgaExtExecutionStatus status = OgaExtExecutionStatus_Fatal;
    std::string text;
    Engine* engine = model->is_static ? OpenStaticEngine(model, *geometry, &status, &text)
                                      : OpenPagedEngine(model, *geometry, &status, &text);
    if (engine == nullptr) {
      WriteMessage(message, capacity, text);
      return status;
    }
    *engine_data = engine;
    return OgaExtExecutionStatus_Ok;
  } catch (const std::bad_alloc&) {
    WriteMessage(message, capacity, "cannot allocate the KV cache: out of memory");
    return OgaExtExecutionStatus_CapacityExceeded;
  } catch (const std::exception& error) {
    return Failure(error, message, capacity);
  }
}

// Runs one step of `engine` (`step`: ExecutePaged or ExecuteStatic) if it is of the kind the
// callback serves, turning its status text and any exception into the callback's status and message.
template <typename Inputs, typename Step>
OgaExtExecutionStatus RunStep(void* engine_data, bool is_static, Step step, const Inputs* in, OgaExtStepOutputs* out,
                              char* message, size_t capacity) {
  Engine* engine = static_cast<Engine*>(engine_data);
  if (engine->is_static != is_static) {
    WriteMessage(message, capacity, is_static ? "a static step on a paged decoder's engine"
                                              : "a paged step on a static-batching decoder's engine");
    return OgaExtExecutionStatus_Fatal;
  }
  try {
    std::string text;
    OgaExtExecutionStatus status = step(engine, in, out, &text);
    if (status != OgaExtExecutionStatus_Ok) WriteMessage(message, capacity, text);
    return status;
  } catch (const std::bad_alloc&) {
    WriteMessage(message, capacity, "std::bad_alloc");
    return OgaExtExecutionStatus_CapacityExceeded;
  } catch (const std::exception& error) {
    return Failure(error, message, capacity);
  }
}

OgaExtExecutionStatus Execute(void* engine_data, const OgaExtStepInputs* in, OgaExtStepOutputs* out, char* message,
                              size_t capacity) {
  return RunStep(engine_data, false, ExecutePaged, in, out, message, capacity);
}

OgaExtExecutionStatus ExecuteStaticStep(void* engine_data, const OgaExtStaticStepInputs* in, OgaExtStepOutputs* out,
                                        char* message, size_t capacity) {
  return RunStep(engine_data, true, ExecuteStatic, in, out, message, capacity);
}

void CloseEngine(void* engine_data) { delete static_cast<Engine*>(engine_data); }

void ReleaseModel(void* model_data) { delete static_cast<Model*>(model_data); }

}  // namespace

extern "C" {

OGA_NATIVE_EXPORT size_t OgaNativeDecoderSpecSize(void) { return sizeof(OgaNativeDecoderSpec); }
OGA_NATIVE_EXPORT size_t OgaNativeFixedStateSize(void) { return sizeof(OgaNativeFixedState); }
OGA_NATIVE_EXPORT size_t OgaNativeCacheTensorSize(void) { return sizeof(OgaNativeCacheTensor); }

OGA_NATIVE_EXPORT uint32_t OgaNativeExecutorApiVersion(void) { return kApiVersion; }

OGA_NATIVE_EXPORT int32_t OgaNativeRuntimeOpen(const char* library_path, uint32_t api_version, char* message,
                                               size_t message_capacity) {
  std::string error;
  if (OpenRuntime(library_path ? library_path : "", api_version, &error) == nullptr) {
    WriteMessage(message, message_capacity, error);
    return 1;
  }
  return 0;
}

OGA_NATIVE_EXPORT const char* OgaNativeRuntimeVersion(void) {
  const Runtime* runtime = CurrentRuntime();
  return runtime ? runtime->version.c_str() : "";
}

OGA_NATIVE_EXPORT int32_t OgaNativeExecutorCheckApi(char* message, size_t message_capacity) {
  const Runtime* runtime = CurrentRuntime();
  if (runtime == nullptr) {
    WriteMessage(message, message_capacity, "ONNX Runtime is not open (OgaNativeRuntimeOpen)");
    return 1;
  }
  const OrtApi* api = runtime->api;
  std::string failure;
  OrtMemoryInfo* cpu = nullptr;
  OrtValue* value = nullptr;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  try {
    // CreateStatus / GetErrorCode / GetErrorMessage / ReleaseStatus
    OrtStatus* status = Entry<OrtStatus* (*)(int, const char*)>(api, kCreateStatus)(kInvalidArgument, "oga check");
    int code = Entry<int (*)(const OrtStatus*)>(api, kGetErrorCode)(status);
    std::string text = Entry<const char* (*)(const OrtStatus*)>(api, kGetErrorMessage)(status);
    Entry<void (*)(OrtStatus*)>(api, kReleaseStatus)(status);
    if (code != kInvalidArgument || text != "oga check")
      throw std::runtime_error("CreateStatus/GetErrorCode/GetErrorMessage returned code " + std::to_string(code) +
                               " and text '" + text + "'");
    // CreateCpuMemoryInfo / MemoryInfoGetName
    Check(api, Entry<OrtStatus* (*)(int, int, OrtMemoryInfo**)>(api, kCreateCpuMemoryInfo)(kDeviceAllocator,
                                                                                          kMemTypeDefault, &cpu));
    const char* name = nullptr;
    Check(api, Entry<OrtStatus* (*)(const OrtMemoryInfo*, const char**)>(api, kMemoryInfoGetName)(cpu, &name));
    if (name == nullptr || std::string(name) != "Cpu")
      throw std::runtime_error(std::string("MemoryInfoGetName returned '") + (name ? name : "(null)") + "'");
    // CreateTensorWithDataAsOrtValue / GetTensorMutableData / GetTensorTypeAndShape /
    // GetTensorElementType / GetDimensionsCount / GetDimensions / ReleaseTensorTypeAndShapeInfo / ReleaseValue
    int32_t data[6] = {0, 1, 2, 3, 4, 5};
    const int64_t shape[2] = {2, 3};
    Check(api, Entry<OrtStatus* (*)(const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, int, OrtValue**)>(
                   api, kCreateTensorWithDataAsOrtValue)(cpu, data, sizeof(data), shape, 2, ortapi::kInt32, &value));
    void* address = nullptr;
    Check(api, Entry<OrtStatus* (*)(OrtValue*, void**)>(api, kGetTensorMutableData)(value, &address));
    if (address != data) throw std::runtime_error("GetTensorMutableData does not return the tensor's memory");
    Check(api, Entry<OrtStatus* (*)(const OrtValue*, OrtTensorTypeAndShapeInfo**)>(api, kGetTensorTypeAndShape)(
                   value, &info));
    int type = 0;
    size_t rank = 0;
    int64_t dims[2] = {0, 0};
    Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int*)>(api, kGetTensorElementType)(info,
                                                                                                         &type));
    Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, size_t*)>(api, kGetDimensionsCount)(info,
                                                                                                         &rank));
    if (rank == 2)
      Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)>(api, kGetDimensions)(
                     info, dims, 2));
    if (type != ortapi::kInt32 || rank != 2 || dims[0] != 2 || dims[1] != 3)
      throw std::runtime_error("a [2, 3] int32 tensor reads back as type " + std::to_string(type) + ", rank " +
                               std::to_string(rank) + ", [" + std::to_string(dims[0]) + ", " +
                               std::to_string(dims[1]) + "]");
    // GetAllocatorWithDefaultOptions / AllocatorFree: freeing NULL through the default allocator
    OrtAllocator* allocator = nullptr;
    Check(api, Entry<OrtStatus* (*)(OrtAllocator**)>(api, kGetAllocatorWithDefaultOptions)(&allocator));
    if (allocator == nullptr) throw std::runtime_error("GetAllocatorWithDefaultOptions returned NULL");
  } catch (const std::exception& error) {
    failure = error.what();
  }
  if (info) Entry<void (*)(OrtTensorTypeAndShapeInfo*)>(api, kReleaseTensorTypeAndShapeInfo)(info);
  if (value) Entry<void (*)(OrtValue*)>(api, kReleaseValue)(value);
  if (cpu) Entry<void (*)(OrtMemoryInfo*)>(api, kReleaseMemoryInfo)(cpu);
  if (!failure.empty()) {
    WriteMessage(message, message_capacity, "ONNX Runtime C API check failed: " + failure);
    return 1;
  }
  return 0;
}

OGA_NATIVE_EXPORT int32_t OgaNativeSessionOpen(const OgaNativeSessionSpec* spec, void** session, char* message,
                                               size_t message_capacity) {
  const Runtime* runtime = CurrentRuntime();
  if (runtime == nullptr) {
    WriteMessage(message, message_capacity, "ONNX Runtime is not open (OgaNativeRuntimeOpen)");
    return 1;
  }
  try {
    *session = OpenSession(runtime, *spec);
  } catch (const OrtError& error) {
    WriteMessage(message, message_capacity, error.body());
    return 1;
  } catch (const std::exception& error) {
    WriteMessage(message, message_capacity, error.what());
    return 1;
  }
  return 0;
}

OGA_NATIVE_EXPORT void OgaNativeSessionRelease(void* session) { delete static_cast<Model*>(session); }

OGA_NATIVE_EXPORT size_t OgaNativeSessionDescribe(void* session, char* text, size_t capacity) {
  std::string description;
  try {
    description = Describe(*static_cast<Model*>(session));
  } catch (const std::exception& error) {
    WriteMessage(text, capacity, error.what());
    return 0;
  }
  WriteMessage(text, capacity, description);
  return description.size() + 1;
}

OGA_NATIVE_EXPORT int32_t OgaNativeExecutorLoad(void* session, const OgaNativeDecoderSpec* spec,
                                                OgaExtModelExecutor* executor, char* message,
                                                size_t message_capacity) {
  Model* model = static_cast<Model*>(session);
  try {
    Configure(model, *spec);
  } catch (const std::exception& error) {
    WriteMessage(message, message_capacity, error.what());
    return 1;
  }
  executor->model_data = model;
  executor->open_engine = OpenEngine;
  executor->execute = Execute;
  executor->execute_static = ExecuteStaticStep;
  executor->close_engine = CloseEngine;
  executor->release_model = ReleaseModel;
  executor->num_fixed_states = model->fixed_row_bytes.size();
  executor->fixed_state_row_bytes = model->fixed_row_bytes.empty() ? nullptr : model->fixed_row_bytes.data();
  return 0;
}

OGA_NATIVE_EXPORT uint64_t OgaNativeModelRunNs(const void* model_data) {
  return static_cast<const Model*>(model_data)->run_ns.load();
}

OGA_NATIVE_EXPORT uint64_t OgaNativeModelBindCount(const void* model_data) {
  return static_cast<const Model*>(model_data)->binds.load();
}

}  // extern "C"
