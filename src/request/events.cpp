#include "request/events.h"

#include <utility>

namespace oga {

void EventQueue::Push(EngineEvent&& event) {
  if (size_ == slots_.size()) Grow();
  EngineEvent& slot = slots_[(head_ + size_) % slots_.size()];
  slot = std::move(event);
  if (slot.request) ++slot.request->retained_events;
  ++size_;
}

void EventQueue::PushFront(EngineEvent&& event) {
  if (size_ == slots_.size()) Grow();
  head_ = (head_ + slots_.size() - 1) % slots_.size();
  EngineEvent& slot = slots_[head_];
  slot = std::move(event);
  if (slot.request) ++slot.request->retained_events;
  ++size_;
}

void EventQueue::PopFrontInto(EngineEvent& destination) {
  EngineEvent& front = slots_[head_];
  if (front.request) --front.request->retained_events;
  destination = std::move(front);
  front = EngineEvent{};
  head_ = (head_ + 1) % slots_.size();
  --size_;
}

void EventQueue::PopFront() {
  EngineEvent& front = slots_[head_];
  if (front.request) --front.request->retained_events;
  front = EngineEvent{};
  head_ = (head_ + 1) % slots_.size();
  --size_;
}

void EventQueue::RemoveRequest(const Request* request) {
  size_t kept = 0;
  for (size_t i = 0; i < size_; ++i) {
    EngineEvent& event = At(i);
    if (event.request.get() == request) {
      --event.request->retained_events;
      event = EngineEvent{};
      continue;
    }
    if (kept != i) {
      At(kept) = std::move(event);
      event = EngineEvent{};
    }
    ++kept;
  }
  size_ = kept;
}

void EventQueue::Clear() {
  while (!empty()) PopFront();
}

void EventQueue::Grow() {
  // Only fatal-failure publication can exceed the reserved capacity (one event per bound request).
  std::vector<EngineEvent> grown(slots_.size() * 2);
  for (size_t i = 0; i < size_; ++i) grown[i] = std::move(At(i));
  slots_ = std::move(grown);
  head_ = 0;
}

}  // namespace oga
