// The step API of onnxruntime-genai 0.10-0.15 (OgaCreateRequest(params), OgaEngineAddRequest /
// RemoveRequest / Step, OgaRequestAddTokens / Continue / HasUnseenTokens / GetUnseenToken /
// IsDone / IsTurnComplete / SetOpaqueData / GetOpaqueData) as a compatibility form on the engine.
//
// A StepRequest is created without an engine, from GeneratorParams (its search settings: max_length
// is the session cap, sampling the turn policy, min_length a floor per turn). Its input tokens wait
// in `input` until an engine admits it; each admission or continuation begins a turn of one engine
// Request, and the tokens the engine generates queue in `unseen` until the caller reads them.
//
// StepDriver is an engine's side of it. Step() (owner thread) first admits what other threads
// added, then hands back the oldest request that still has unseen tokens, or runs one engine step
// and hands back the first request it gave a token to, or returns null when there is nothing to do.
// AddRequest and RemoveRequest from another thread are queued for the owner thread (the owner's
// next Step or HasPendingRequests applies them) instead of being refused: OGA's continuous-batching
// example adds requests from a producer thread while the owner thread steps.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model.h"
#include "config/model_config.h"

namespace oga {

class StepDriver;

enum class StepRequestState : uint8_t {
  Created,       // not added to an engine yet: AddTokens collects its prompt
  Queued,        // added (or continued), waiting for the owner thread or for admission
  Running,       // its turn is generating
  TurnComplete,  // the turn ended (EOS, max_length): AddTokens / Continue begin the next one
  Removed,       // removed from its engine, released, or its engine is gone: output is frozen
};

struct StepRequest {
  StepRequest(std::shared_ptr<Model> model, const SearchConfig& search) : model(std::move(model)), search(search) {}

  const std::shared_ptr<Model> model;
  const SearchConfig search;
  std::atomic<void*> opaque{nullptr};
  std::atomic<OgaRequest*> handle{nullptr};  // the caller's handle (null once released)

  // Guarded by `mutex` (the caller's threads and the engine's owner thread touch them).
  std::mutex mutex;
  StepRequestState state = StepRequestState::Created;
  std::vector<int32_t> input;   // tokens for the next turn, not yet given to the engine
  std::vector<int32_t> unseen;  // generated tokens; [unseen_read, size) not read yet
  size_t unseen_read = 0;
  size_t sequence_length = 0;   // tokens given to the engine and generated so far
  std::string failure;          // why its turn failed, if it did
  StepDriver* driver = nullptr; // the engine it was added to (null once that engine is gone)
  uint64_t engine_id = 0;       // that engine's id (stays set: ids are never reused, addresses are)
  bool removal_requested = false;

  // Owner thread only: the engine request, once admitted.
  std::shared_ptr<Request> core;

  bool has_unseen() const { return unseen_read < unseen.size(); }
  // Validates and appends tokens for the next turn (AddTokens / Continue); `continuation` only
  // accepts a request whose turn is complete. Returns true when the request must be queued for
  // its engine's owner thread (a continuation). Call with `mutex` held.
  bool AddInput(const int32_t* tokens, size_t count, bool continuation);
};

class StepDriver {
 public:
  explicit StepDriver(std::shared_ptr<Engine> engine);
  ~StepDriver();

  // Any thread. Checks the request now (0.13's texts); the owner thread admits it (at once when
  // called on it, else at its next Step or HasPendingRequests).
  void AddRequest(const std::shared_ptr<StepRequest>& request);
  // Any thread. Stops the request's generation and releases its cache; what it generated stays
  // readable, nothing more comes. Requests of another engine are refused.
  void RemoveRequest(const std::shared_ptr<StepRequest>& request);
  // Any thread: a turn-complete request got new input (AddTokens / Continue).
  void Continue(const std::shared_ptr<StepRequest>& request);
  // [owner] The next request with unseen tokens, or nullptr.
  StepRequest* Step();
  // [owner] Queued, unread or schedulable work exists.
  bool HasPendingRequests();
  // Whether requests of the step API are live on this engine (its Run is then refused).
  bool serving();
  // The engine is being destroyed: every request is removed.
  void Teardown() noexcept;

 private:
  // [owner] Applies what other threads queued: admissions, continuations, removals.
  void ApplyInbox();
  void Admit(StepRequest& request);
  void Remove(StepRequest& request);
  void Dispatch(const EngineEvent& event);
  // Drops requests whose handle was released (the engine reclaims their cache).
  void DropReleased();
  void Post(const std::shared_ptr<StepRequest>& request);

  std::shared_ptr<Engine> engine_;
  std::unique_ptr<OgaEngineEventBuffer> buffer_;
  std::mutex inbox_mutex_;
  std::vector<std::shared_ptr<StepRequest>> inbox_;  // guarded by inbox_mutex_
  std::atomic<bool> inbox_pending_{false};
  std::atomic<size_t> live_count_{0};
  // Owner thread only.
  std::vector<std::shared_ptr<StepRequest>> live_;  // added and not removed
  std::deque<StepRequest*> ready_;                   // got tokens, in the order they got them
};

}  // namespace oga
