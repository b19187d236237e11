// The Engine: owns requests, scheduler, paged cache, packed IO and the executor, and runs one
// transaction per Run call (seed: "One dynamic step in detail").
//
// Transaction order: plan -> reserve -> (checkpoint) -> pack -> execute -> select and stage ->
// prepare commit -> publish (cache, admissions, request bookkeeping) -> events. Everything before
// publication leaves committed state untouched, so a recoverable failure only discards the
// reservation and the staged results. Publication is fail-stop: any failure there poisons the engine.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/errors.h"
#include "request/events.h"
#include "decoders/hybrid_decoder_io.h"
#include "engine/model.h"
#include "engine/token_selector.h"
#include "decoders/model_executor.h"
#include "cache/paged_cache.h"
#include "request/request.h"
#include "sampling/sampler.h"
#include "scheduler/scheduler.h"
#include "scheduler/static_batch.h"
#include "plan/step_plan.h"
#include "decoders/varlen_decoder_io.h"

struct OgaRequestOptions {
  uint64_t max_session_tokens = 0;  // 0 = unset
};

namespace oga {

// Caller-supplied draft verification telemetry (og.Engine.get_speculative_stats()).
struct SpeculativeCounters {
  uint64_t rounds = 0;                  // rows that verified at least one draft
  uint64_t draft_tokens_proposed = 0;   // proposals' tokens, counted when set
  uint64_t draft_tokens_evaluated = 0;  // drafts scheduled into a committed step
  uint64_t draft_tokens_accepted = 0;
  uint64_t correction_tokens = 0;       // a draft rejected: the target's token replaces it
  uint64_t bonus_tokens = 0;            // every draft accepted: the token after them
  uint64_t tokens_emitted = 0;          // tokens published by verifying rows
  uint64_t target_forward_passes = 0;   // committed model runs that verified drafts
  uint64_t full_accept_rounds = 0;
  uint64_t partial_accept_rounds = 0;
  uint64_t zero_accept_rounds = 0;
  std::array<uint64_t, 8> acceptance_length_histogram{};  // rounds by accepted drafts (0..7)
};

// The engine's counters; the token selector keeps its own part (SelectionCounters) in them.
struct EngineCounters : SelectionCounters {
  uint64_t model_runs = 0;
  uint64_t committed_steps = 0;
  uint64_t rolled_back_steps = 0;
  uint64_t step_ns = 0;
  uint64_t executor_ns = 0;
  uint64_t fixed_state_direct_steps = 0;
  uint64_t fixed_state_fallback_steps = 0;
  uint64_t preemptions = 0;        // residents whose cache a step released to make room
  uint64_t recomputed_tokens = 0;  // tokens prefilled again after a preemption (committed steps)
};

// Sizes a Generator's private engine asks for beyond the model's configuration.
struct EngineSizing {
  size_t min_batch_size = 0;          // rows per step and residents at least this many
  size_t max_blocks = 0;              // dynamic path: at most this many KV blocks (0 = the configuration's)
  size_t static_max_length = 0;       // static path: the contiguous cache length (0 = search.max_length)
  size_t selection_participants = 0;  // threads that select a step's tokens, at most (0 = default)
  // Static path: run decoders with fixed state (LFM2's short-convolution layers), which the static
  // executor keeps per row. Set by a Generator's private engine only: 0.18's Generator runs them,
  // its Engine refuses them, and oga does the same.
  bool static_fixed_state = false;
};

class Engine {
 public:
  // Throws ApiError for configurations the engine cannot run.
  static std::shared_ptr<Engine> Create(std::shared_ptr<Model> model, const EngineSizing& sizing = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Closes every bound request (no-throw detach), discards events, closes the executor. Idempotent.
  void Teardown() noexcept;

  uint64_t id() const { return id_; }
  const Model& model() const { return *model_; }
  void CheckOwnerThread() const {
    if (std::this_thread::get_id() != owner_) throw ApiError(kOwnerThreadMessage);
  }
  // A Generator's private engine follows whichever thread calls the Generator (0.18's Generator has
  // no thread affinity); the Generator's lock orders those calls, so one thread owns it at a time.
  void AdoptOwnerThread() { owner_ = std::this_thread::get_id(); }
  bool IsOwnerThread() const { return std::this_thread::get_id() == owner_; }
  // Rethrows the stored fatal error of a poisoned engine.
  void ThrowIfUnhealthy() const;
  bool healthy() const { return !unhealthy_; }
  const std::string& fatal_message() const { return fatal_message_; }

  std::shared_ptr<Request> CreateRequest(const OgaRequestOptions* options, const SearchConfig& search);
  uint64_t BeginTurn(Request& request, const OgaTurnOptions* options, const int32_t* input_ids, uint64_t count);
  // BeginTurn with the turn's option values (nullptr = the request's search defaults).
  uint64_t BeginTurnWith(Request& request, const TurnOptionValues* values, const int32_t* input_ids, uint64_t count);
  bool CancelTurn(Request& request, uint64_t turn_id);
  // Replaces the request's pending draft proposal (seed: "Caller-supplied speculative drafts"); empty
  // clears.
  void SetDraftTokens(Request& request, const int32_t* tokens, size_t count);
  // Drafts one proposal may hold; 0 when the executor cannot verify drafts.
  size_t max_draft_tokens() const { return static_batching() ? 0 : limits_.max_draft_tokens; }
  const SpeculativeCounters& speculative_counters() const { return speculative_; }
  // Truncates the request back to where turn `turn_id` began. Dynamic path: the request also gives
  // its blocks and residency back, and its next turn prefills the retained history again, as 0.18
  // does (docs/onnxruntime-genai-0.18-dynamic-engine.md, "Rewind (`rewind_to_start_of_turn`)").
  void RewindToStartOfTurn(Request& request, uint64_t turn_id);
  // Generator rows (generator.h). Truncates a request between turns to its first `length` tokens
  // (what RewindToStartOfTurn does at a turn boundary).
  void TruncateRequest(Request& request, size_t length);
  // Paces `request`: it may produce `tokens` more tokens, then no step schedules it until allowed
  // again (Request::schedulable).
  void AllowTokens(Request& request, uint32_t tokens);
  // The request's next sampling step keeps its logits row instead of selecting a token
  // (Request::held_logits); no-op when logits are held already.
  void HoldLogits(Request& request);
  // Selects the request's next token from its held logits (the caller may have changed them) with
  // its turn policy, outside any model run, and publishes it like a step would.
  void SelectHeldToken(Request& request);
  // Throws what SelectHeldToken would throw (e.g. every held logit NaN) and changes nothing, so a
  // caller selecting for several requests can check them all before publishing any.
  void CheckHeldTokenSelectable(Request& request);
  void Close(Request& request);
  void Run(OgaEngineEventBuffer& buffer);
  // Moves the events of `buffer` back to the front of the retained events, in order, and empties
  // it: the next Run delivers them again. For a caller that could not read them (see
  // OgaExtEngineRequeueEvents).
  void Requeue(OgaEngineEventBuffer& buffer);
  // Whether the last Run returned early because a callback was interrupted (its Retryable event is
  // retained for the next Run).
  bool last_run_interrupted() const { return last_run_interrupted_; }
  bool HasPendingRequests();
  // Any thread: a request's last external handle was released.
  void NotifyAbandoned() noexcept { abandonment_pending_.store(true, std::memory_order_release); }

  bool static_batching() const { return static_scheduler_ != nullptr; }
  // The static path with fixed decoder state: a row's state cannot be cut back to an earlier
  // length, so such a request cannot be truncated (rewound) except to nothing.
  bool static_fixed_state() const { return static_fixed_state_; }
  size_t max_batch_size() const { return limits_.max_batch_size; }
  // 0 on the static path (no per-step budget; no bound beyond search.max_length), as in 0.18.
  size_t max_scheduled_tokens() const { return static_batching() ? 0 : limits_.max_scheduled_tokens; }
  uint64_t max_request_length() const { return static_batching() ? 0 : max_request_length_; }

  // Introspection (owner thread).
  std::string CheckInvariants() const;  // empty when every invariant holds
  const EngineCounters& counters() const { return counters_; }
  const PagedKeyValueCache& cache() const { return cache_; }
  const DynamicBatchScheduler& scheduler() const { return scheduler_; }
  size_t bound_request_count() const { return bound_.size(); }
  size_t retained_event_count() const { return pending_.size(); }
  const OgaExtStepInputs& last_step_inputs() const { return hybrid_io_ ? hybrid_io_->inputs() : io_.inputs(); }
  // Benchmarks and tests (hybrid models): always gather / stage fixed state.
  void SetFixedStateFallbackOnly(bool fallback_only);
  void SetLastTurnIdForTesting(Request& request, uint64_t turn_id);

 private:
  // SelectHeldToken's checks and selection, without publishing.
  StagedResult StageHeldToken(Request& request);

  Engine(std::shared_ptr<Model> model, const SchedulerLimits& limits, size_t block_size, size_t num_blocks,
         uint64_t max_request_length, size_t selection_participants);
  static std::shared_ptr<Engine> CreateStatic(std::shared_ptr<Model> model, const EngineSizing& sizing);

  TurnPolicy ResolveTurnPolicy(const Request& request, const TurnOptionValues* values, uint64_t sequence_after) const;
  void Truncate(Request& request, size_t boundary);
  void ReclaimAbandoned();
  // The admission queue of whichever path this engine runs (dynamic or static).
  void ReserveWaitingSlot();
  void EnqueueWaiting(Request& request);
  void RemoveWaiting(Request& request);
  void CloseRequest(Request& request) noexcept;
  // Throws ApiError while a transaction runs (an executor callback calling back in).
  void CheckNoStepInFlight(const char* what) const;

  void Step();
  // One transaction over an executable plan, phase by phase; each phase that fails has rolled back
  // (or, past publication, marked the engine unhealthy) and reported, and returns false.
  void ExecuteTransaction();
  bool ReserveTransaction();
  // Packs the plan, runs the decoder once and checks its logits.
  bool ExecuteModel(OgaExtStepOutputs& outputs);
  bool SelectAndStage(const OgaExtStepOutputs& outputs);
  // Commit preparation (the last undoable point), then fail-stop publication.
  void CommitTransaction();
  // The static path: one batch step without the paged transaction (rows share one contiguous cache).
  void StepStatic();
  // Executable turns in publication order (residents or batch rows, then the waiting queue).
  void CollectExecutable(std::vector<Request*>& out) const;
  // Hands the plan's sampling rows to the token selector and selects them into staged_.
  void StageResults(const OgaExtStepOutputs& outputs);
  // Proves the fixed-state reservation is the one the plan asked for (row count, new slots, binding
  // bytes, per-row request identity); throws ContractError otherwise.
  void CheckFixedStateReservation() const;
  void PublishCommit();
  // Whether the executor's outputs are usable: "" or what is wrong with them.
  std::string CheckLogitsOutputs(const OgaExtStepOutputs& outputs, size_t expected_rows) const;
  // Appends the staged token, ends the turn when staged so, and queues the row's event.
  void PublishToken(Request& request, const StagedResult& staged);
  // The turn's stop strings, grammar and draft proposal are done with.
  static void EndTurnState(Request& request) noexcept;
  void CountVerification(const RequestStepPlan& row, const StagedResult& staged);
  void Rollback();
  void FailUnserviceable(Request& request);
  // Recompute preemption: while a resident waits for blocks or nothing fits, releases a victim's
  // cache and plans again (until no victim is left).
  void PreemptForCapacity();
  // Releases `request`'s blocks and residency; a running turn is requeued to prefill its committed
  // tokens again, a turn-complete one prefills its history at its next turn (as after a rewind).
  void Preempt(Request& request);
  void PushEngineEvent(OgaEngineEventFlags flags, OgaErrorCode code);
  // After the rollback of a step whose callback was interrupted: a Retryable event, kept for the next Run.
  void RetryInterrupted();
  // Ends `request`'s turn with `reason` and publishes its terminal event, merged into the last
  // retained token event of the same turn when one exists.
  void PublishTerminal(Request& request, OgaFinishReason reason, OgaErrorCode code);
  // The one way a step breaks the engine: stores "<stage> failed and the Engine is no longer healthy.
  // Cause: <cause>" (every later call rethrows it) and fails every executable turn with `code`, or
  // publishes one engine-level Failed event when there is none.
  void MarkUnhealthy(OgaErrorCode code, const char* stage, const std::string& cause) noexcept;
  // The one mapping of a failed step's status to what Run reports (after the caller's rollback):
  // Retryable -> a Retryable event, Interrupted -> RetryInterrupted, CapacityExceeded -> a
  // CapacityBlocked event, anything else -> MarkUnhealthy(fatal_code, stage, cause).
  void EndFailedStep(OgaExtExecutionStatus status, OgaErrorCode fatal_code, const char* stage,
                     const std::string& cause);
  void Deliver(OgaEngineEventBuffer& buffer);
  FaultInjector* faults() const { return model_->faults(); }

  std::shared_ptr<Model> model_;
  const uint64_t id_;
  std::thread::id owner_;
  const SchedulerLimits limits_;
  const uint64_t max_request_length_;
  const size_t vocab_size_;
  uint64_t seed_sequence_;  // unseeded requests' seed bases: Mix64 of a Weyl sequence from the OS

  PagedKeyValueCache cache_;
  DynamicBatchScheduler scheduler_;
  VarlenDecoderIO io_;
  std::unique_ptr<HybridDecoderIO> hybrid_io_;  // hybrid models: io_ plus the fixed-state bindings
  ModelExecutor executor_;
  // Set only on the static path.
  std::unique_ptr<StaticBatchScheduler> static_scheduler_;
  std::unique_ptr<StaticBatchDecoderIO> static_io_;
  bool static_fixed_state_ = false;
  std::vector<StagedResult> static_staged_;

  std::vector<std::shared_ptr<Request>> bound_;  // strong references to every bound request
  uint64_t next_request_serial_ = 1;
  std::atomic<bool> abandonment_pending_{false};

  StepPlan plan_;
  std::vector<StagedResult> staged_;
  EventQueue pending_;
  std::vector<Request*> failed_rows_;  // rows whose turn failed in this step (poisoned grammar)

  SpeculativeCounters speculative_;
  bool in_step_ = false;  // a transaction is running (executor callbacks may call back in)
  // The step was rolled back because a callback was interrupted (OgaExtExecutionStatus_Interrupted):
  // Run returns without delivering, the retained Retryable event goes to the next Run.
  bool interrupted_ = false;
  bool last_run_interrupted_ = false;

  bool unhealthy_ = false;
  std::string fatal_message_;
  bool torn_down_ = false;
  EngineCounters counters_;
  // After counters_, whose SelectionCounters it updates.
  TokenSelector selector_;
};

}  // namespace oga

namespace oga {
class StepDriver;
}

// C handle. `steps` serves the step API's requests on this engine (step_requests.h).
struct OgaEngine {
  std::shared_ptr<oga::Engine> engine;
  std::shared_ptr<oga::StepDriver> steps;
};
