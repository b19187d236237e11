#include "runtime.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>

#include "oga/oga_ext.h"

namespace native {

namespace {

std::mutex runtime_mutex;
Runtime* runtime = nullptr;  // kept for the process once opened

// The C API version a runtime provides: ORT's API version is its minor release number
// (ORT_API_VERSION in 1.N's header is N). Asking GetApi for versions to find out would make ORT
// print an error for each refused one.
uint32_t ProvidedApiVersion(const std::string& version) {
  size_t dot = version.find('.');
  if (dot == std::string::npos) return 0;
  return static_cast<uint32_t>(std::strtoul(version.c_str() + dot + 1, nullptr, 10));
}

}  // namespace

const Runtime* OpenRuntime(const std::string& path, uint32_t api_version, std::string* error) {
  std::lock_guard<std::mutex> lock(runtime_mutex);
  if (runtime != nullptr) {
    if (runtime->path != path) {
      void* other = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (other == nullptr) {
        const char* reason = dlerror();
        *error = "cannot load ONNX Runtime from " + path + ": " + (reason ? reason : "dlopen failed");
      } else {
        dlclose(other);
        *error = "ONNX Runtime is already open from " + runtime->path + " in this process; cannot open " + path;
      }
      return nullptr;
    }
    if (api_version <= runtime->api_version) return runtime;
  }
  // RTLD_LOCAL: the runtime's symbols stay out of the process's global namespace (the onnxruntime
  // Python module carries its own copy of ORT).
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    *error = "cannot load ONNX Runtime from " + path + ": " + (reason ? reason : "dlopen failed");
    return nullptr;
  }
  using GetApiBase = const OrtApiBase* (*)();
  auto get_api_base = reinterpret_cast<GetApiBase>(dlsym(handle, "OrtGetApiBase"));
  if (get_api_base == nullptr) {
    *error = path + " does not export OrtGetApiBase (not an ONNX Runtime library)";
    dlclose(handle);
    return nullptr;
  }
  const OrtApiBase* base = get_api_base();
  std::string version = base->GetVersionString();
  uint32_t provided = ProvidedApiVersion(version);
  if (provided != 0 && provided < api_version) {
    *error = "ONNX Runtime " + version + " (" + path + ") provides C API versions up to " + std::to_string(provided) +
             "; oga's native executor needs version " + std::to_string(api_version);
    dlclose(handle);
    return nullptr;
  }
  const OrtApi* api = base->GetApi(api_version);
  if (api == nullptr) {
    *error = "ONNX Runtime " + version + " (" + path + ") does not provide C API version " +
             std::to_string(api_version) + ", which oga's native executor needs";
    dlclose(handle);
    return nullptr;
  }
  if (runtime != nullptr) {  // the same library, now asked for a newer version it has
    runtime->api = api;
    runtime->api_version = api_version;
    return runtime;
  }
  OrtEnv* env = nullptr;
  if (OrtStatus* status = Entry<OrtStatus* (*)(int, const char*, OrtEnv**)>(api, kCreateEnv)(kLogWarning, "oga",
                                                                                          &env)) {
    *error = "cannot create the ONNX Runtime environment: " + StatusText(api, status);
    Entry<void (*)(OrtStatus*)>(api, kReleaseStatus)(status);
    dlclose(handle);
    return nullptr;
  }
  // The library stays loaded for the process: sessions, the environment and ORT's thread pools
  // live in it.
  runtime = new Runtime{path, version, api_version, api, env};
  return runtime;
}

const Runtime* CurrentRuntime() {
  std::lock_guard<std::mutex> lock(runtime_mutex);
  return runtime;
}

namespace {

// onnxruntime's Python binding: the exception type per OrtErrorCode, and Status::ToString().
const char* const kErrorTypes[] = {"Ok",          "Fail",           "InvalidArgument",  "NoSuchFile",
                                   "NoModel",     "EngineError",    "RuntimeException", "InvalidProtobuf",
                                   "ModelLoaded", "NotImplemented", "InvalidGraph",     "EPFail"};
const char* const kErrorCodes[] = {"SUCCESS",      "FAIL",            "INVALID_ARGUMENT",  "NO_SUCHFILE",
                                   "NO_MODEL",     "ENGINE_ERROR",    "RUNTIME_EXCEPTION", "INVALID_PROTOBUF",
                                   "MODEL_LOADED", "NOT_IMPLEMENTED", "INVALID_GRAPH",     "EP_FAIL"};

bool KnownCode(int code) { return code >= 0 && code < static_cast<int>(sizeof(kErrorTypes) / sizeof(kErrorTypes[0])); }

}  // namespace

std::string OrtErrorBody(int code, const std::string& message) {
  return "[ONNXRuntimeError] : " + std::to_string(code) + " : " + (KnownCode(code) ? kErrorCodes[code] : "GENERAL ERROR") +
         " : " + message;
}

std::string FormatOrtError(int code, const std::string& message) {
  return std::string(KnownCode(code) ? kErrorTypes[code] : "RuntimeError") + ": " + OrtErrorBody(code, message);
}

std::string StatusText(const OrtApi* api, const OrtStatus* status) {
  int code = Entry<int (*)(const OrtStatus*)>(api, kGetErrorCode)(status);
  const char* message = Entry<const char* (*)(const OrtStatus*)>(api, kGetErrorMessage)(status);
  return FormatOrtError(code, message ? message : "");
}

void Check(const OrtApi* api, OrtStatus* status) {
  if (status == nullptr) return;
  int code = Entry<int (*)(const OrtStatus*)>(api, kGetErrorCode)(status);
  const char* message = Entry<const char* (*)(const OrtStatus*)>(api, kGetErrorMessage)(status);
  std::string body = OrtErrorBody(code, message ? message : "");
  Entry<void (*)(OrtStatus*)>(api, kReleaseStatus)(status);
  throw OrtError(code, FormatOrtError(code, message ? message : ""), body);
}

uint32_t ClassifyFailure(const std::string& text) {
  static const char* const kOutOfMemory[] = {"bad_alloc", "failed to allocate memory", "out of memory",
                                             "cudaerrormemoryallocation", "cuda_error_out_of_memory",
                                             "cublas_status_alloc_failed", "cudnn_status_alloc_failed"};
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* marker : kOutOfMemory)
    if (lower.find(marker) != std::string::npos) return OgaExtExecutionStatus_CapacityExceeded;
  return OgaExtExecutionStatus_Fatal;
}

}  // namespace native
