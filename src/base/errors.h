// Exception types that cross the core and are translated at the C boundary.
#pragma once

#include <stdexcept>
#include <string>

namespace oga {

// A caller mistake or an illegal state: becomes an OgaResult with exactly this message and changes
// nothing.
class ApiError : public std::runtime_error {
 public:
  explicit ApiError(const std::string& message) : std::runtime_error(message) {}
};

// A transaction-internal failure that proves collaborators disagree (reservation does not match the
// plan, commit preparation failed, ...). The engine poisons itself with EngineContractFailure.
class ContractError : public std::runtime_error {
 public:
  explicit ContractError(const std::string& message) : std::runtime_error(message) {}
};

// A recoverable failure while post-processing one step: the transaction is rolled back and Run
// reports a Retryable event.
class RetryableStepError : public std::runtime_error {
 public:
  explicit RetryableStepError(const std::string& message) : std::runtime_error(message) {}
};

// The executor's device failed an operation the engine asked of it (reading logits back, batched
// sampling): the step is rolled back and the engine poisons itself with the device's reason.
class DeviceError : public std::runtime_error {
 public:
  explicit DeviceError(const std::string& message) : std::runtime_error(message) {}
};

// A callback reported OgaExtExecutionStatus_Interrupted (the caller's thread was interrupted, e.g.
// Python's KeyboardInterrupt inside a Python callback): nothing failed. Inside a step the
// transaction is rolled back as Retryable and Run returns without delivering events; elsewhere the
// call fails without effect.
class InterruptedError : public std::runtime_error {
 public:
  explicit InterruptedError(const std::string& message) : std::runtime_error(message) {}
};

inline constexpr const char* kOwnerThreadMessage = "Engine operations must be called from the Engine owner thread.";
inline constexpr const char* kClosedRequestMessage = "Cannot use a closed request.";

}  // namespace oga
