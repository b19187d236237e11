// Small helpers shared by the engine's translation units (engine/*.cpp).
#pragma once

#include <chrono>
#include <cstdint>

#include "oga/oga.h"
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

}  // namespace engine_detail
}  // namespace oga
