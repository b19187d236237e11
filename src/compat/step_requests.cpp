#include "compat/step_requests.h"

#include <algorithm>
#include <utility>

#include "base/errors.h"
#include "request/events.h"
#include "request/turn_options.h"

namespace oga {
namespace {

TurnOptionValues TurnValues(const StepRequest& request, size_t length_after_input) {
  // search.min_length is a floor on the whole sequence, as in the Generator of that era.
  TurnOptionValues values;
  const int64_t min_length = request.search.min_length;
  if (min_length > static_cast<int64_t>(length_after_input)) {
    values.min_generated_tokens = static_cast<uint64_t>(min_length) - length_after_input;
    const int64_t room = request.search.max_length - static_cast<int64_t>(length_after_input);
    values.min_generated_tokens = std::min<uint64_t>(values.min_generated_tokens, room > 0 ? room : 0);
  }
  return values;
}

}  // namespace

bool StepRequest::AddInput(const int32_t* tokens, size_t count, bool continuation) {
  if (count == 0) throw ApiError("Expected at least one token for generation. Received 0.");
  const size_t vocab_size = static_cast<size_t>(model->config().vocab_size);
  for (size_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= vocab_size) {
      throw ApiError("input_ids[" + std::to_string(i) + "] (" + std::to_string(tokens[i]) +
                     ") is outside the model's vocabulary [0, " + std::to_string(vocab_size) + ").");
    }
  }
  switch (state) {
    case StepRequestState::Created:
      if (continuation) throw ApiError("Continue is only valid after the request's turn is complete.");
      break;
    case StepRequestState::Queued:
      throw ApiError("Cannot add tokens to a request that is waiting for admission to the engine.");
    case StepRequestState::Running:
      throw ApiError("Cannot add tokens while the request is generating; add them once its turn is complete.");
    case StepRequestState::TurnComplete:
      if (!failure.empty()) throw ApiError("Cannot continue a request whose turn failed: " + failure);
      break;
    case StepRequestState::Removed:
      throw ApiError("Cannot add tokens to a request that was removed from its engine.");
  }
  const size_t length = sequence_length + input.size() + count;
  if (static_cast<int64_t>(length) >= search.max_length) {
    throw ApiError("Adding " + std::to_string(count) + " tokens makes the sequence " + std::to_string(length) +
                   " tokens long, which leaves no room to generate before max_length (" +
                   std::to_string(search.max_length) + ").");
  }
  input.insert(input.end(), tokens, tokens + count);
  if (state == StepRequestState::TurnComplete) {
    state = StepRequestState::Queued;
    return true;
  }
  return false;
}

StepDriver::StepDriver(std::shared_ptr<Engine> engine)
    : engine_(std::move(engine)),
      buffer_(std::make_unique<OgaEngineEventBuffer>(engine_->id(), engine_->max_batch_size() * 2 + 8)) {}

StepDriver::~StepDriver() { Teardown(); }

void StepDriver::Post(const std::shared_ptr<StepRequest>& request) {
  std::lock_guard<std::mutex> lock(inbox_mutex_);
  inbox_.push_back(request);
  inbox_pending_.store(true, std::memory_order_release);
}

void StepDriver::AddRequest(const std::shared_ptr<StepRequest>& request) {
  {
    std::lock_guard<std::mutex> lock(request->mutex);
    if (request->state != StepRequestState::Created) {
      throw ApiError("Cannot add the request to the engine since it is already assigned.");
    }
    if (request->input.empty()) throw ApiError("Cannot schedule a request with no tokens.");
    if (request->model.get() != &engine_->model()) {
      throw ApiError("The request's GeneratorParams were created for another model than the engine's.");
    }
    request->state = StepRequestState::Queued;
    request->driver = this;
    request->engine_id = engine_->id();
  }
  live_count_.fetch_add(1, std::memory_order_acq_rel);
  if (!engine_->IsOwnerThread()) {
    Post(request);  // the owner thread admits it
    return;
  }
  live_.push_back(request);
  try {
    Admit(*request);
  } catch (...) {
    // Nothing was admitted: the request is as before the call.
    live_.pop_back();
    live_count_.fetch_sub(1, std::memory_order_acq_rel);
    std::lock_guard<std::mutex> lock(request->mutex);
    request->state = StepRequestState::Created;
    request->driver = nullptr;
    request->engine_id = 0;
    if (request->core) {
      engine_->Close(*request->core);
      request->core.reset();
    }
    throw;
  }
}

void StepDriver::Continue(const std::shared_ptr<StepRequest>& request) {
  if (!engine_->IsOwnerThread()) {
    Post(request);
    return;
  }
  Admit(*request);
}

void StepDriver::RemoveRequest(const std::shared_ptr<StepRequest>& request) {
  {
    std::lock_guard<std::mutex> lock(request->mutex);
    if (request->engine_id == 0) throw ApiError("Cannot remove a request that was never added to an engine.");
    if (request->engine_id != engine_->id()) throw ApiError("Cannot remove a request that belongs to another engine.");
    if (request->state == StepRequestState::Removed) return;
    request->removal_requested = true;
  }
  if (!engine_->IsOwnerThread()) {
    Post(request);
    return;
  }
  Remove(*request);
}

void StepDriver::Admit(StepRequest& request) {
  std::lock_guard<std::mutex> lock(request.mutex);
  if (request.state != StepRequestState::Queued || request.removal_requested) return;
  if (!request.core) {
    SearchConfig search = request.search;
    search.min_length = 0;  // a floor per turn (TurnValues), which the engine takes per turn
    request.core = engine_->CreateRequest(nullptr, search);
    request.core->step_request = &request;
  }
  const TurnOptionValues values = TurnValues(request, request.sequence_length + request.input.size());
  engine_->BeginTurnWith(*request.core, &values, request.input.data(), request.input.size());
  request.sequence_length += request.input.size();
  request.input.clear();
}

void StepDriver::Remove(StepRequest& request) {
  {
    std::lock_guard<std::mutex> lock(request.mutex);
    if (request.state == StepRequestState::Removed) return;
    request.state = StepRequestState::Removed;
    request.input.clear();
    if (request.core) {
      engine_->Close(*request.core);
      request.core->step_request = nullptr;
      request.core.reset();
    }
  }
  ready_.erase(std::remove(ready_.begin(), ready_.end(), &request), ready_.end());
  auto it = std::find_if(live_.begin(), live_.end(),
                         [&request](const std::shared_ptr<StepRequest>& live) { return live.get() == &request; });
  if (it != live_.end()) {
    live_.erase(it);
    live_count_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void StepDriver::ApplyInbox() {
  if (!inbox_pending_.load(std::memory_order_acquire)) return;
  std::vector<std::shared_ptr<StepRequest>> inbox;
  {
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    inbox.swap(inbox_);
    inbox_pending_.store(false, std::memory_order_release);
  }
  for (const std::shared_ptr<StepRequest>& request : inbox) {
    bool removal;
    {
      std::lock_guard<std::mutex> lock(request->mutex);
      removal = request->removal_requested;
    }
    if (std::find(live_.begin(), live_.end(), request) == live_.end()) live_.push_back(request);
    if (removal) {
      Remove(*request);
      continue;
    }
    try {
      Admit(*request);
    } catch (const std::exception& error) {
      // Queued from another thread, so no caller can be told: the request ends its turn with the
      // reason, which GetUnseenToken reports once its tokens are read.
      std::lock_guard<std::mutex> lock(request->mutex);
      request->state = StepRequestState::TurnComplete;
      request->failure = error.what();
      request->input.clear();
    }
  }
}

void StepDriver::DropReleased() {
  for (size_t i = live_.size(); i > 0; --i) {
    StepRequest& request = *live_[i - 1];
    if (request.handle.load(std::memory_order_acquire) == nullptr) Remove(request);
  }
}

void StepDriver::Dispatch(const EngineEvent& event) {
  StepRequest* request = event.request ? event.request->step_request : nullptr;
  if (request == nullptr) return;
  std::lock_guard<std::mutex> lock(request->mutex);
  if (request->state == StepRequestState::Removed) return;
  if (event.flags & OgaEngineEventFlag_Token) {
    request->unseen.push_back(event.token);
    ++request->sequence_length;
    request->state = StepRequestState::Running;
    if (std::find(ready_.begin(), ready_.end(), request) == ready_.end()) ready_.push_back(request);
  }
  if (event.flags & OgaEngineEventFlag_TurnFinished) {
    request->state = StepRequestState::TurnComplete;
    if (event.finish_reason == OgaFinishReason_Failed) {
      request->failure = "The request can no longer be served (it does not fit the engine's KV cache).";
    }
  }
}

StepRequest* StepDriver::Step() {
  engine_->CheckOwnerThread();
  ApplyInbox();
  DropReleased();
  auto next_ready = [this]() -> StepRequest* {
    while (!ready_.empty()) {
      StepRequest* request = ready_.front();
      std::lock_guard<std::mutex> lock(request->mutex);
      if (request->has_unseen()) return request;  // handed back until its tokens are read
      ready_.pop_front();
    }
    return nullptr;
  };
  if (StepRequest* ready = next_ready()) return ready;
  if (!engine_->HasPendingRequests()) return nullptr;
  engine_->Run(*buffer_);
  if (engine_->last_run_interrupted()) throw InterruptedError("The engine step was interrupted.");
  for (size_t i = 0; i < buffer_->count; ++i) Dispatch(buffer_->slots[i]);
  engine_->ThrowIfUnhealthy();
  // Admitted requests are no longer waiting: tokens added now would reach a running turn.
  for (const std::shared_ptr<StepRequest>& request : live_) {
    std::lock_guard<std::mutex> lock(request->mutex);
    if (request->state == StepRequestState::Queued && request->core && request->core->resident()) {
      request->state = StepRequestState::Running;
    }
  }
  return next_ready();
}

bool StepDriver::HasPendingRequests() {
  engine_->CheckOwnerThread();
  ApplyInbox();
  DropReleased();
  if (inbox_pending_.load(std::memory_order_acquire)) return true;
  for (StepRequest* request : ready_) {
    std::lock_guard<std::mutex> lock(request->mutex);
    if (request->has_unseen()) return true;
  }
  return engine_->HasPendingRequests();
}

bool StepDriver::serving() { return live_count_.load(std::memory_order_acquire) > 0; }

void StepDriver::Teardown() noexcept {
  std::vector<std::shared_ptr<StepRequest>> requests;
  {
    std::lock_guard<std::mutex> lock(inbox_mutex_);
    requests.swap(inbox_);
    inbox_pending_.store(false, std::memory_order_release);
  }
  requests.insert(requests.end(), live_.begin(), live_.end());
  for (const std::shared_ptr<StepRequest>& request : requests) {
    std::lock_guard<std::mutex> lock(request->mutex);
    request->state = StepRequestState::Removed;
    request->driver = nullptr;  // this driver is going away; engine_id still names its engine
    request->input.clear();
    if (request->core) request->core->step_request = nullptr;
    request->core.reset();  // the engine's teardown closes it
  }
  live_.clear();
  ready_.clear();
  live_count_.store(0, std::memory_order_release);
}

}  // namespace oga
