// The engine's side of the model-executor boundary: opens per-engine executor state, runs one
// packed step and classifies the outcome. The executor itself is a C callback table
// (OgaExtModelExecutor), so that executors can live outside the core: the native ONNX Runtime
// executor (native_executor/), the Python one (oga/executor/) and the test executor.
#pragma once

#include <cstddef>
#include <string>

#include "oga/oga_ext.h"

namespace oga {

struct ExecutionResult {
  OgaExtExecutionStatus status = OgaExtExecutionStatus_Ok;
  std::string message;  // set when status != Ok
};

class ModelExecutor {
 public:
  ModelExecutor() = default;
  ~ModelExecutor();
  ModelExecutor(const ModelExecutor&) = delete;
  ModelExecutor& operator=(const ModelExecutor&) = delete;

  // Throws ApiError when the executor cannot open (allocation of its caches failed, ...).
  void Open(const OgaExtModelExecutor& executor, const OgaExtEngineGeometry& geometry);
  // Releases the per-engine state; idempotent.
  void Close() noexcept;

  // Runs the decoder once. On Ok, `outputs` holds the logits.
  ExecutionResult Execute(const OgaExtStepInputs& inputs, OgaExtStepOutputs& outputs);
  // The same for a static-batching step; the executor must have execute_static.
  ExecutionResult ExecuteStatic(const OgaExtStaticStepInputs& inputs, OgaExtStepOutputs& outputs);

  bool per_token_logits() const { return executor_.per_token_logits != 0; }

 private:
  ExecutionResult Classify(OgaExtExecutionStatus status);

  OgaExtModelExecutor executor_{};
  void* engine_data_ = nullptr;
  bool open_ = false;
  char message_[1024] = {};
};

}  // namespace oga
