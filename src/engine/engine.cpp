// The step transaction: Run's drain-or-execute, planning, preemption, the reservation, execution,
// commit and rollback, and the events they publish (see engine.h).
#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "base/mix64.h"
#include "sampling/first_max.h"
#include "sampling/sampler.h"
#include "engine/engine_support.h"

namespace oga {
using engine_detail::NowNs;
using engine_detail::StatusOfCaughtException;
using engine_detail::UsageOf;

bool Engine::HasPendingRequests() {
  CheckOwnerThread();
  ReclaimAbandoned();
  const bool work = static_batching() ? static_scheduler_->HasExecutableWork() : scheduler_.HasExecutableWork();
  return !pending_.empty() || (!unhealthy_ && work);
}

void Engine::Run(OgaEngineEventBuffer& buffer) {
  // From an executor or device callback: a nested step would plan over the live reservation.
  CheckNoStepInFlight("run the engine");
  if (unhealthy_ && pending_.empty()) ThrowIfUnhealthy();
  if (buffer.slots.empty()) return;  // capacity 0: validated no-op
  ++buffer.generation;
  buffer.count = 0;
  last_run_interrupted_ = false;
  ReclaimAbandoned();
  if (pending_.empty() && !unhealthy_) {
    interrupted_ = false;
    Step();
    if (interrupted_) {
      // The caller was interrupted (see OgaExtExecutionStatus_Interrupted): control goes back at
      // once; the step's Retryable event is delivered by the next Run.
      interrupted_ = false;
      last_run_interrupted_ = true;
      return;
    }
  }
  Deliver(buffer);
}

void Engine::Requeue(OgaEngineEventBuffer& buffer) {
  CheckOwnerThread();
  CheckNoStepInFlight("requeue events");
  for (size_t i = buffer.count; i > 0; --i) pending_.PushFront(std::move(buffer.slots[i - 1]));
  buffer.count = 0;
}

void Engine::Deliver(OgaEngineEventBuffer& buffer) {
  const size_t capacity = buffer.slots.size();
  while (buffer.count < capacity && !pending_.empty()) pending_.PopFrontInto(buffer.slots[buffer.count++]);
}

void Engine::Step() {
  struct InStep {
    bool& flag;
    explicit InStep(bool& f) : flag(f) { flag = true; }
    ~InStep() { flag = false; }
  } in_step(in_step_);
  if (static_batching()) {
    StepStatic();
    return;
  }
  try {
    const OgaExtExecutionStatus fault =
        faults() != nullptr ? faults()->Consult(OgaExtFaultPhase_Plan) : OgaExtExecutionStatus_Ok;
    if (fault == OgaExtExecutionStatus_Fatal) throw ContractError("injected planning consistency fault");
    if (fault != OgaExtExecutionStatus_Ok) throw std::bad_alloc();
    scheduler_.PlanStep(plan_);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& error) {
    MarkUnhealthy(OgaErrorCode_EngineContractFailure, "Dynamic scheduler planning", error.what());
    return;
  }
  if (limits_.preemption) PreemptForCapacity();
  switch (plan_.outcome) {
    case StepOutcome::NoWork:
      return;
    case StepOutcome::CapacityDeferred:
      PushEngineEvent(OgaEngineEventFlag_CapacityBlocked, OgaErrorCode_CapacityDeferred);
      return;
    case StepOutcome::UnserviceableRequest:
      // Publish the failures alone; the fitting work runs on the next call.
      for (Request* request : plan_.unserviceable) FailUnserviceable(*request);
      return;
    case StepOutcome::Executable:
      break;
  }
  const uint64_t start = NowNs();
  ExecuteTransaction();
  counters_.step_ns += NowNs() - start;
}

void Engine::ExecuteTransaction() {
  if (!ReserveTransaction()) return;
  // Checkpoint: requests are not mutated before publication (results are staged in staged_), so the
  // committed request state is itself the checkpoint and rollback only discards.
  OgaExtStepOutputs outputs{};
  if (!ExecuteModel(outputs)) return;
  if (!SelectAndStage(outputs)) return;
  CommitTransaction();
}

bool Engine::ReserveTransaction() {
  // Reserve the complete cache transaction.
  try {
    if (faults() != nullptr && faults()->Consult(OgaExtFaultPhase_Reserve) != OgaExtExecutionStatus_Ok) {
      throw ContractError("injected reservation fault");
    }
    cache_.Reserve(plan_);
    CheckFixedStateReservation();
  } catch (const InterruptedError&) {
    Rollback();
    RetryInterrupted();
    return false;
  } catch (const std::exception& error) {
    cache_.Discard();
    MarkUnhealthy(OgaErrorCode_EngineContractFailure, "Transaction preparation", error.what());
    return false;
  }
  return true;
}

bool Engine::ExecuteModel(OgaExtStepOutputs& outputs) {
  const OgaExtStepInputs* inputs = nullptr;
  try {
    inputs = hybrid_io_ ? &hybrid_io_->Pack(plan_, cache_) : &io_.Pack(plan_, cache_);
  } catch (const std::exception& error) {
    Rollback();
    MarkUnhealthy(OgaErrorCode_EngineContractFailure, "Transaction preparation", error.what());
    return false;
  }
  // Run the decoder once.
  const uint64_t execute_start = NowNs();
  ExecutionResult result = executor_.Execute(*inputs, outputs);
  counters_.executor_ns += NowNs() - execute_start;
  ++counters_.model_runs;
  if (result.status == OgaExtExecutionStatus_Ok) {
    const size_t expected_rows = executor_.per_token_logits() ? plan_.num_tokens : plan_.rows.size();
    if (const std::string failure = CheckLogitsOutputs(outputs, expected_rows); !failure.empty()) {
      result.status = OgaExtExecutionStatus_Fatal;
      result.message = "the executor returned " + failure;
    }
  }
  if (result.status != OgaExtExecutionStatus_Ok) {
    Rollback();
    EndFailedStep(result.status, OgaErrorCode_EngineExecutionFailure, "Model execution", result.message);
    return false;
  }
  return true;
}

bool Engine::SelectAndStage(const OgaExtStepOutputs& outputs) {
  // Select and stage next tokens.
  try {
    StageResults(outputs);
    // After the draws, so a rolled-back step proves that staged draws never reach the requests.
    if (faults() != nullptr && faults()->Consult(OgaExtFaultPhase_Sample) != OgaExtExecutionStatus_Ok) {
      throw RetryableStepError("injected post-processing fault");
    }
  } catch (...) {
    // Fatal: the device failed a read or a sampling launch (or returned nonsense): its state is unknown.
    std::string cause;
    const OgaExtExecutionStatus status = StatusOfCaughtException(cause);
    Rollback();
    EndFailedStep(status, OgaErrorCode_EngineExecutionFailure, "Token selection", cause);
    return false;
  }
  return true;
}

void Engine::CommitTransaction() {
  // Prepare the commit: the last point where the transaction can still be undone.
  try {
    if (faults() != nullptr && faults()->Consult(OgaExtFaultPhase_CommitPrepare) != OgaExtExecutionStatus_Ok) {
      throw ContractError("injected commit-preparation fault");
    }
    cache_.ValidateCommit(plan_);
  } catch (const std::exception& error) {
    Rollback();
    MarkUnhealthy(OgaErrorCode_EngineContractFailure, "Transaction preparation", error.what());
    return;
  }
  // The fixed state's copies into inactive banks: the last fallible device work. Committed state is
  // intact after a failure, but a half-written inactive bank cannot be proven whole for a retry.
  try {
    cache_.PrepareCommit(plan_);
  } catch (const InterruptedError&) {
    // Only inactive banks and unpublished checkpoints were written: the retry writes them again.
    Rollback();
    RetryInterrupted();
    return;
  } catch (const std::exception& error) {
    Rollback();
    MarkUnhealthy(OgaErrorCode_EngineExecutionFailure, "Transaction commit preparation", error.what());
    return;
  }
  // Publication is fail-stop.
  try {
    if (faults() != nullptr && faults()->Consult(OgaExtFaultPhase_Commit) != OgaExtExecutionStatus_Ok) {
      throw std::runtime_error("injected commit fault");
    }
    PublishCommit();
  } catch (const std::exception& error) {
    cache_.Discard();
    MarkUnhealthy(OgaErrorCode_EngineExecutionFailure, "Transaction commit", error.what());
  }
}

std::string Engine::CheckLogitsOutputs(const OgaExtStepOutputs& outputs, size_t expected_rows) const {
  if (outputs.logits == nullptr || outputs.logits_rows != expected_rows || outputs.logits_row_stride < vocab_size_ ||
      outputs.logits_type > OgaExtLogitsType_Float16) {
    return std::to_string(outputs.logits_rows) + " logits rows of stride " + std::to_string(outputs.logits_row_stride) +
           "; expected " + std::to_string(expected_rows) + " rows of at least " + std::to_string(vocab_size_) +
           " logits";
  }
  if (outputs.logits_on_device != 0 && !selector_.reads_device_logits()) {
    return "device logits, but its OgaExtDeviceOps has no read operation";
  }
  if (outputs.logits_block_maxima != nullptr) {
    const size_t blocks = (vocab_size_ + kFirstMaxBlock - 1) / kFirstMaxBlock;
    if (outputs.logits_on_device != 0 || outputs.logits_type != OgaExtLogitsType_Float32 ||
        outputs.logits_block_maxima_stride < blocks) {
      return "logits block maxima of stride " + std::to_string(outputs.logits_block_maxima_stride) +
             "; expected host float32 logits and at least " + std::to_string(blocks) + " maxima per row";
    }
  }
  return std::string();
}

void Engine::SetFixedStateFallbackOnly(bool fallback_only) {
  FixedStatePool* pool = cache_.fixed_state();
  if (pool == nullptr) throw ApiError("This engine's model has no fixed decoder state.");
  pool->set_fallback_only(fallback_only);
}

void Engine::PublishCommit() {
  const FixedStatePool* fixed = cache_.fixed_state();
  const bool fixed_direct = fixed != nullptr && fixed->direct();
  cache_.Commit(plan_);
  scheduler_.CommitAdmissions(plan_);
  // Scheduler order, whatever order the rows executed in: events follow it.
  for (const size_t r : plan_.publish_order) {
    const RequestStepPlan& row = plan_.rows[r];
    row.request->processed = row.processed_before + row.committed_tokens();
    // Tokens a preempted cache had held are redone work (adopted prefix-cache blocks are not).
    size_t& until = row.request->recompute_until;
    if (row.processed_before < until) counters_.recomputed_tokens += std::min(until, row.request->processed) - row.processed_before;
    if (row.request->processed >= until) until = 0;
    if (row.request->recomputing) {
      if (row.samples) {
        row.request->recomputing = false;
        row.request->draft_tokens.clear();  // proposed for the token this step sampled
      }
    } else if (row.newly_admitted) {
      // Only adopted tokens of this turn's own input count (a rewound request re-adopts its history).
      const size_t adopted = row.cached_blocks * cache_.block_size();
      const size_t history = row.request->turn_starts.empty() ? 0 : row.request->turn_starts.back().second;
      row.request->turn_cached_tokens = adopted > history ? adopted - history : 0;
    }
    if (row.samples && !row.prefill) row.request->draft_tokens.clear();  // a committed decode consumes its proposal
    if (row.draft_count > 0) CountVerification(row, staged_[r]);
    if (row.samples) PublishToken(*row.request, staged_[r]);
    if (row.samples && staged_[r].finish_reason == OgaFinishReason_Failed) failed_rows_.push_back(row.request);
  }
  cache_.IndexCommitted(plan_);
  for (const RequestStepPlan& row : plan_.rows) {
    if (row.draft_count > 0) {
      ++speculative_.target_forward_passes;
      break;
    }
  }
  // A turn that failed in this step cannot continue: its cache goes back to the pool now.
  for (Request* request : failed_rows_) {
    scheduler_.Remove(*request);
    cache_.Release(*request);
  }
  failed_rows_.clear();
  ++counters_.committed_steps;
  if (fixed != nullptr) ++(fixed_direct ? counters_.fixed_state_direct_steps : counters_.fixed_state_fallback_steps);
}

void Engine::Rollback() {
  cache_.Discard();
  ++counters_.rolled_back_steps;
}

void Engine::PreemptForCapacity() {
  // Preemption is a committed operation of its own, before the step's transaction: it changes no
  // request's tokens, turn, search or sampler state, only where (whether) its KV cache lives, which
  // is derived state a prefill recomputes. A step that then rolls back leaves the victims queued.
  bool preempted_running = false;
  while (plan_.outcome == StepOutcome::CapacityDeferred ||
         (plan_.outcome == StepOutcome::Executable && plan_.deferred_residents > 0)) {
    Request* victim = scheduler_.PreemptionVictim();
    if (victim == nullptr) return;
    scheduler_.ReserveWaitingSlot();  // may throw bad_alloc before anything changed
    preempted_running = preempted_running || victim->executable();
    Preempt(*victim);
    // Admitting into the room a running victim just made would only preempt again.
    scheduler_.PlanStep(plan_, !preempted_running);
  }
}

void Engine::Preempt(Request& request) {
  const bool running = request.executable();
  const size_t cached = request.processed;
  scheduler_.Remove(request);
  cache_.Release(request);
  request.processed = 0;
  request.recompute_until = std::max(request.recompute_until, cached);
  ++counters_.preemptions;
  if (!running) return;  // turn-complete: its next BeginTurn queues it like a rewound request
  // The caller's proposal was for the token after the pending one; the recompute samples that token.
  request.draft_tokens.clear();
  // Queued to prefill again: Assigned, like any turn waiting for admission.
  request.status = RequestStatus::Assigned;
  request.recomputing = true;
  scheduler_.EnqueueFront(request);
}

void Engine::FailUnserviceable(Request& request) {
  scheduler_.Remove(request);
  cache_.Release(request);
  PublishTerminal(request, OgaFinishReason_Failed, OgaErrorCode_RequestUnserviceable);
}

void Engine::RetryInterrupted() {
  PushEngineEvent(OgaEngineEventFlag_Retryable, OgaErrorCode_RetryableExecution);
  interrupted_ = true;
}

void Engine::PushEngineEvent(OgaEngineEventFlags flags, OgaErrorCode code) {
  EngineEvent event;
  event.flags = flags;
  event.error_code = code;
  pending_.Push(std::move(event));
}

void Engine::PublishTerminal(Request& request, OgaFinishReason reason, OgaErrorCode code) {
  request.status = RequestStatus::TurnComplete;
  request.finish_reason = reason;
  EndTurnState(request);
  const OgaEngineEventFlags terminal =
      OgaEngineEventFlag_TurnFinished | (reason == OgaFinishReason_Failed ? OgaEngineEventFlag_Failed : 0u);
  for (size_t i = pending_.size(); i > 0; --i) {
    EngineEvent& retained = pending_.At(i - 1);
    if (retained.request.get() != &request) continue;
    if (retained.turn_id == request.turn_id && (retained.flags & OgaEngineEventFlag_TurnFinished) == 0) {
      retained.flags |= terminal;
      retained.finish_reason = reason;
      retained.error_code = code;
      retained.usage = UsageOf(request);
      return;
    }
    break;
  }
  EngineEvent event;
  event.flags = terminal;
  event.turn_id = request.turn_id;
  event.finish_reason = reason;
  event.error_code = code;
  event.usage = UsageOf(request);
  event.request = request.shared_from_this();
  pending_.Push(std::move(event));
}

void Engine::EndFailedStep(OgaExtExecutionStatus status, OgaErrorCode fatal_code, const char* stage,
                           const std::string& cause) {
  switch (status) {
    case OgaExtExecutionStatus_Retryable:
      PushEngineEvent(OgaEngineEventFlag_Retryable, OgaErrorCode_RetryableExecution);
      return;
    case OgaExtExecutionStatus_Interrupted:
      RetryInterrupted();
      return;
    case OgaExtExecutionStatus_CapacityExceeded:
      PushEngineEvent(OgaEngineEventFlag_CapacityBlocked, OgaErrorCode_ExecutionCapacityExceeded);
      return;
    default:
      MarkUnhealthy(fatal_code, stage, cause);
      return;
  }
}

void Engine::MarkUnhealthy(OgaErrorCode code, const char* stage, const std::string& cause) noexcept {
  unhealthy_ = true;
  try {
    fatal_message_ = std::string(stage) + " failed and the Engine is no longer healthy. Cause: " + cause;
  } catch (...) {
    fatal_message_.clear();
  }
  if (fatal_message_.empty()) {
    fatal_message_ = "The Engine encountered a fatal failure, and the underlying exception could not be recorded.";
  }
  bool affected = false;
  try {
    std::vector<Request*> executable;
    CollectExecutable(executable);
    for (Request* request : executable) {
      RemoveWaiting(*request);
      PublishTerminal(*request, OgaFinishReason_Failed, code);
      affected = true;
    }
    if (!affected) PushEngineEvent(OgaEngineEventFlag_Failed, code);
  } catch (...) {
    // Out of memory while publishing failures: the stored error still makes every later call fail.
  }
}

void Engine::CollectExecutable(std::vector<Request*>& out) const {
  if (static_batching()) {
    for (const StaticRow& row : static_scheduler_->rows()) {
      if (row.request->executable()) out.push_back(row.request.get());
    }
    for (Request* request : static_scheduler_->waiting()) out.push_back(request);
    return;
  }
  for (Request* request : scheduler_.residents()) {
    if (request->executable()) out.push_back(request);
  }
  for (Request* request : scheduler_.waiting()) out.push_back(request);
}

}  // namespace oga
