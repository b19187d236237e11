// Engine events: what a committed (or failed) step publishes, the retained queue, and the caller's
// buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "oga/oga.h"
#include "request/request.h"

struct OgaTurnUsage {
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t cached_prompt_tokens = 0;
};

struct OgaEngineEvent {
  OgaEngineEventFlags flags = OgaEngineEventFlag_None;
  uint64_t turn_id = 0;
  int32_t token = 0;
  OgaFinishReason finish_reason = OgaFinishReason_None;
  int32_t matched_stop_string_index = -1;
  OgaErrorCode error_code = OgaErrorCode_None;
  OgaTurnUsage usage;
  std::shared_ptr<oga::Request> request;  // keeps the request alive while the event exists
};

namespace oga {

using EngineEvent = OgaEngineEvent;

// FIFO of retained (undelivered) events: a ring over storage reserved at engine creation, so the
// common step neither allocates nor frees.
class EventQueue {
 public:
  explicit EventQueue(size_t capacity) : slots_(capacity > 0 ? capacity : 1) {}

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

  void Push(EngineEvent&& event);
  // Puts an event back in front of the oldest (an event delivered to a buffer its caller never read).
  void PushFront(EngineEvent&& event);
  // Moves the oldest event into `destination` (a caller's buffer slot) and drops it from the queue.
  void PopFrontInto(EngineEvent& destination);
  void PopFront();
  // i-th event from the front.
  EngineEvent& At(size_t i) { return slots_[(head_ + i) % slots_.size()]; }
  const EngineEvent& At(size_t i) const { return slots_[(head_ + i) % slots_.size()]; }
  // Removes every event of `request`, keeping the order of the others.
  void RemoveRequest(const Request* request);
  void Clear();

 private:
  void Grow();

  std::vector<EngineEvent> slots_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace oga

// C handle: caller-owned storage of `capacity` events, bound to one engine.
struct OgaEngineEventBuffer {
  explicit OgaEngineEventBuffer(uint64_t engine_id, size_t capacity) : engine_id(engine_id), slots(capacity) {}
  const uint64_t engine_id;            // serial of the creating engine (serials are never reused)
  std::vector<oga::EngineEvent> slots;  // exactly `capacity` slots, allocated once
  size_t count = 0;
  uint64_t generation = 0;  // successfully validated runs; views of older generations are stale
};
