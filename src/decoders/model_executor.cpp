#include "decoders/model_executor.h"

#include <cstring>

#include "base/errors.h"

namespace oga {

ModelExecutor::~ModelExecutor() { Close(); }

void ModelExecutor::Open(const OgaExtModelExecutor& executor, const OgaExtEngineGeometry& geometry) {
  executor_ = executor;
  message_[0] = '\0';
  void* engine_data = nullptr;
  OgaExtExecutionStatus status =
      executor_.open_engine(executor_.model_data, &geometry, &engine_data, message_, sizeof(message_));
  if (status != OgaExtExecutionStatus_Ok) {
    message_[sizeof(message_) - 1] = '\0';
    throw ApiError(std::string("The model executor could not prepare the engine: ") + message_);
  }
  engine_data_ = engine_data;
  open_ = true;
}

void ModelExecutor::Close() noexcept {
  if (!open_) return;
  open_ = false;
  if (executor_.close_engine != nullptr) executor_.close_engine(engine_data_);
  engine_data_ = nullptr;
}

ExecutionResult ModelExecutor::Execute(const OgaExtStepInputs& inputs, OgaExtStepOutputs& outputs) {
  std::memset(&outputs, 0, sizeof(outputs));
  message_[0] = '\0';
  return Classify(executor_.execute(engine_data_, &inputs, &outputs, message_, sizeof(message_)));
}

ExecutionResult ModelExecutor::ExecuteStatic(const OgaExtStaticStepInputs& inputs, OgaExtStepOutputs& outputs) {
  std::memset(&outputs, 0, sizeof(outputs));
  message_[0] = '\0';
  return Classify(executor_.execute_static(engine_data_, &inputs, &outputs, message_, sizeof(message_)));
}

ExecutionResult ModelExecutor::Classify(OgaExtExecutionStatus status) {
  ExecutionResult result;
  result.status = status;
  if (result.status != OgaExtExecutionStatus_Ok) {
    message_[sizeof(message_) - 1] = '\0';
    result.message = message_[0] != '\0' ? message_ : "the model executor reported a failure without a message";
    if (result.status > OgaExtExecutionStatus_Interrupted) result.status = OgaExtExecutionStatus_Fatal;
  }
  return result;
}

}  // namespace oga
