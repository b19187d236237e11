// runtime.h -- ONNX Runtime as the native executor sees it: the library opened once per process
// (dlopen, OrtGetApiBase, GetApi of the version the executor needs), the one OrtEnv every session
// shares, and OrtStatus turned into the error text and failure class the Python executor produces.
#ifndef OGA_NATIVE_EXECUTOR_RUNTIME_H_
#define OGA_NATIVE_EXECUTOR_RUNTIME_H_

#include <stdexcept>
#include <string>

#include "ort_session_api.h"

namespace native {

using namespace ortsession;

struct Runtime {
  std::string path;        // the libonnxruntime.so opened
  std::string version;     // GetVersionString()
  uint32_t api_version = 0;
  const OrtApi* api = nullptr;
  OrtEnv* env = nullptr;   // shared by every session; never released (it owns ORT's logging)
};

// Opens the runtime (see OgaNativeRuntimeOpen). Returns it, or nullptr with the reason in *error.
const Runtime* OpenRuntime(const std::string& path, uint32_t api_version, std::string* error);
// The runtime a successful OpenRuntime kept, or nullptr.
const Runtime* CurrentRuntime();

// An ONNX Runtime failure, with the text the onnxruntime Python binding raises for the same status
// from its other calls ("Fail: [ONNXRuntimeError] : 1 : FAIL : <message>"; a failed run is
// "RuntimeError: Error in execution: <message>", see Execute), so both executors report failures
// alike.
class OrtError : public std::runtime_error {
 public:
  OrtError(int code, const std::string& text, const std::string& body)
      : std::runtime_error(text), code_(code), body_(body) {}
  int code() const { return code_; }
  // The text without the exception type: what str() of the Python binding's exception gives.
  const std::string& body() const { return body_; }

 private:
  int code_;
  std::string body_;
};

// Throws OrtError for a non-NULL status (releasing it); `what` is not part of the text (the
// Python binding does not name the call either).
void Check(const OrtApi* api, OrtStatus* status);
// The Python binding's text for `status`, which stays owned by the caller.
std::string StatusText(const OrtApi* api, const OrtStatus* status);
std::string FormatOrtError(int code, const std::string& message);
// FormatOrtError without the leading exception type ("[ONNXRuntimeError] : 1 : FAIL : <message>").
std::string OrtErrorBody(int code, const std::string& message);

// OgaExtExecutionStatus for a failure text: out of memory -> CapacityExceeded, else Fatal (the
// markers of oga/executor/contract.py's classify_failure).
uint32_t ClassifyFailure(const std::string& text);

}  // namespace native

#endif  // OGA_NATIVE_EXECUTOR_RUNTIME_H_
