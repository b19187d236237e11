// Small helpers shared by the engine's translation units (engine/*.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <new>
#include <string>

#include "base/errors.h"
#include "oga/oga.h"
#include "oga/oga_ext.h"
#include "request/request.h"

namespace oga {
namespace engine_detail {

// Monotonic nanoseconds, for the engine's step counters.
inline uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// The usage a request's turn reports on its token and terminal events.
inline OgaTurnUsage UsageOf(const Request& request) {
  OgaTurnUsage usage;
  usage.prompt_tokens = request.turn_prompt_tokens;
  usage.generated_tokens = request.turn_generated_tokens;
  usage.cached_prompt_tokens = request.turn_cached_tokens;
  return usage;
}

// The executor status that means what the exception being handled means (call it only inside a
// catch block), so that a step ends the same way whether its executor returned a failure or its
// post-processing threw one (Engine::EndFailedStep): RetryableStepError -> Retryable,
// InterruptedError -> Interrupted, std::bad_alloc -> CapacityExceeded, any other std::exception ->
// Fatal with its text in `cause`. An exception that is no std::exception propagates.
inline OgaExtExecutionStatus StatusOfCaughtException(std::string& cause) {
  try {
    throw;
  } catch (const RetryableStepError&) {
    return OgaExtExecutionStatus_Retryable;
  } catch (const InterruptedError&) {
    return OgaExtExecutionStatus_Interrupted;
  } catch (const std::bad_alloc&) {
    return OgaExtExecutionStatus_CapacityExceeded;
  } catch (const std::exception& error) {
    cause = error.what();
    return OgaExtExecutionStatus_Fatal;
  }
}

}  // namespace engine_detail
}  // namespace oga
