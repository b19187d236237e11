// The request and turn lifecycle on the owner thread: creation, BeginTurn (policy resolution and
// admission to the waiting queue), cancellation, rewind, close and the reclamation of abandoned
// requests.
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
#include "sampling/sampler.h"

namespace oga {
namespace {

std::string NotSupportedYet(const char* what) {
  return std::string(what) + " is not supported yet by oga. Remove it from the turn options.";
}

}  // namespace

std::shared_ptr<Request> Engine::CreateRequest(const OgaRequestOptions* options, const SearchConfig& search) {
  CheckOwnerThread();
  ThrowIfUnhealthy();
  ReclaimAbandoned();
  if (search.num_beams != 1) {
    throw ApiError("The model configures search.num_beams = " + std::to_string(search.num_beams) +
                   ", and beam search is not supported by the Engine; every Engine Request decodes one sequence with "
                   "one beam. Clear it on the Config before creating the model -- OgaConfigOverlay(config, "
                   "\"{\\\"search\\\":{\\\"num_beams\\\":1}}\"), or in Python config.overlay('{\"search\": "
                   "{\"num_beams\": 1}}') -- and batch across Requests instead.");
  }
  if (search.min_length != 0) {
    throw ApiError("The model configures a nonzero search.min_length (" + std::to_string(search.min_length) +
                   "), which is a session-absolute floor the Engine does not support; its minimum is per turn. Clear "
                   "it on the Config before creating the model -- OgaConfigOverlay(config, "
                   "\"{\\\"search\\\":{\\\"min_length\\\":0}}\"), or in Python config.overlay('{\"search\": "
                   "{\"min_length\": 0}}') -- and use OgaTurnOptionsSetMinGeneratedTokens for a per-turn minimum "
                   "instead.");
  }
  const int64_t max_length = search.max_length != 0 ? search.max_length : model_->config().context_length;
  if (max_length <= 0) {
    throw ApiError("The model's search.max_length must be greater than zero; actual value is " +
                   std::to_string(max_length));
  }
  uint64_t max_session_tokens = std::min<uint64_t>(static_cast<uint64_t>(max_length), max_request_length_);
  if (static_batching() && options != nullptr && options->max_session_tokens > max_request_length_) {
    // The static path bounds a request by the contiguous cache it is allocated with.
    throw ApiError("max_session_tokens (" + std::to_string(options->max_session_tokens) +
                   ") must be greater than zero and no greater than the model-configured search.max_length (" +
                   std::to_string(max_request_length_) + ").");
  }
  if (options != nullptr && options->max_session_tokens != 0) {
    if (options->max_session_tokens > max_request_length_) {
      throw ApiError("max_session_tokens (" + std::to_string(options->max_session_tokens) +
                     ") must be greater than zero and no greater than the Engine's max_request_length (" +
                     std::to_string(max_request_length_) + ").");
    }
    max_session_tokens = options->max_session_tokens;
  }
  bound_.reserve(bound_.size() + 1);
  // The request's durable seed basis: search.random_seed, else the next value of the engine's
  // splitmix64 sequence (seeded once from the OS: a random_device draw costs ~20 us per request).
  const uint64_t seed = search.random_seed ? *search.random_seed
                                           : Mix64(seed_sequence_ += 0x9E3779B97F4A7C15ull);
  auto request = std::make_shared<Request>(this, next_request_serial_++, max_session_tokens, search);
  request->stream.Seed(seed);
  bound_.push_back(request);
  return request;
}

TurnPolicy Engine::ResolveTurnPolicy(const Request& request, const TurnOptionValues* values,
                                     uint64_t sequence_after) const {
  if (values != nullptr && static_batching()) {
    // What the static path can never do, in 0.18's words (before anything not supported yet).
    if (!values->stop_strings.empty()) throw ApiError("Stop strings require an Engine configured for dynamic batching.");
    if (values->seed) throw ApiError("A per-turn seed requires an Engine configured for dynamic batching.");
    if (values->delimited_opening_token) {
      throw ApiError("Delimited guidance requires an Engine configured for dynamic batching.");
    }
  }
  TurnPolicy policy = oga::ResolveTurnPolicy(request.search, values, vocab_size_);
  if (values != nullptr && values->delimited_opening_token) {
    throw ApiError(NotSupportedYet("Delimited guidance (OgaTurnOptionsSetDelimitedGuidance)"));
  }
  if (policy.max_generated_tokens != 0 && policy.min_generated_tokens > policy.max_generated_tokens) {
    throw ApiError("min_generated_tokens (" + std::to_string(policy.min_generated_tokens) +
                   ") must not exceed max_generated_tokens (" + std::to_string(policy.max_generated_tokens) + ").");
  }
  if (policy.min_generated_tokens > request.max_session_tokens - sequence_after) {
    throw ApiError("min_generated_tokens (" + std::to_string(policy.min_generated_tokens) +
                   ") does not fit between the turn's prompt length (" + std::to_string(sequence_after) +
                   ") and max_session_tokens (" + std::to_string(request.max_session_tokens) + ").");
  }
  return policy;
}

uint64_t Engine::BeginTurn(Request& request, const OgaTurnOptions* options, const int32_t* input_ids, uint64_t count) {
  CheckOwnerThread();
  CheckNoStepInFlight("begin a turn");
  ThrowIfUnhealthy();
  ReclaimAbandoned();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (options != nullptr) {
    std::shared_ptr<Request> bound = options->request.lock();
    if (bound.get() != &request) throw ApiError("Turn options belong to a different or destroyed Request.");
  }
  return BeginTurnWith(request, options != nullptr ? &options->values : nullptr, input_ids, count);
}

uint64_t Engine::BeginTurnWith(Request& request, const TurnOptionValues* values, const int32_t* input_ids,
                               uint64_t count) {
  CheckOwnerThread();
  CheckNoStepInFlight("begin a turn");
  ThrowIfUnhealthy();
  ReclaimAbandoned();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (request.executable()) {
    throw ApiError("BeginTurn is only valid for a new request or after the current turn is complete.");
  }
  const bool continuation = request.status == RequestStatus::TurnComplete;
  if (continuation) {
    if (request.retained_events > 0) {
      throw ApiError(
          "Cannot continue a request while an Engine event is pending; call Engine::Run() to drain the event before "
          "continuing.");
    }
    if (request.finish_reason == OgaFinishReason_Failed) throw ApiError("Cannot continue a Request whose current turn failed.");
    if (request.processed > 0 && !request.resident()) {
      throw ApiError("Cannot continue a request whose model state is no longer resident.");
    }
    if (static_batching() && request.static_row >= 0 && static_scheduler_->rows().size() != 1) {
      throw ApiError("Continuous decoding requires exactly one resident request in a static engine batch; actual "
                     "resident request count is " + std::to_string(static_scheduler_->rows().size()) + ".");
    }
  }
  if (count == 0) throw ApiError("Expected at least one input token for generation. Received 0.");
  for (uint64_t i = 0; i < count; ++i) {
    if (input_ids[i] < 0 || static_cast<size_t>(input_ids[i]) >= vocab_size_) {
      throw ApiError("input_ids[" + std::to_string(i) + "] (" + std::to_string(input_ids[i]) +
                     ") is outside the model's vocabulary [0, " + std::to_string(vocab_size_) + ").");
    }
  }
  const uint64_t current = request.tokens.size();
  if (count >= request.max_session_tokens || current >= request.max_session_tokens - count) {
    throw ApiError("Appending input_tokens_count (" + std::to_string(count) + ") to current_sequence_length (" +
                   std::to_string(current) + ") must leave room for at least one generated token before "
                   "max_session_tokens (" + std::to_string(request.max_session_tokens) + ").");
  }
  const TurnPolicy policy = ResolveTurnPolicy(request, values, current + count);
  if (request.turn_id == UINT64_MAX) {
    throw ApiError("The request cannot admit another turn because its uint64 turn id space is exhausted.");
  }
  // The turn's text state: the tokenizer is loaded and the grammar compiled here, so a bad grammar
  // or a missing tokenizer is this call's error.
  StopStringMatcher stop;
  std::unique_ptr<GuidanceCursor> guidance;
  if (values != nullptr && !values->stop_strings.empty()) {
    stop.Reset(values->stop_strings, model_->token_table());
    selector_.ReserveStopScratch(stop.scratch_capacity(kMaxTokensPerStep));
  }
  if (values != nullptr && !values->guidance_type.empty()) {
    guidance = std::make_unique<GuidanceCursor>(model_->guidance_tokenizer(), values->guidance_type,
                                                values->guidance_data);
  }
  failed_rows_.reserve(limits_.max_batch_size);
  // Everything that can fail happens before the first mutation.
  // Room for the input and the first generated token; StageResults grows it (fallibly, before
  // commit) so publication never allocates.
  request.tokens.reserve(current + count + 1);
  request.turn_starts.reserve(request.turn_starts.size() + 1);
  const bool enqueue = !request.resident() && !request.waiting;
  if (enqueue) ReserveWaitingSlot();

  request.tokens.insert(request.tokens.end(), input_ids, input_ids + count);
  request.turn_id += 1;
  request.turn_starts.emplace_back(request.turn_id, current);
  request.turn_prompt_tokens = count;
  request.turn_generated_tokens = 0;
  request.turn_cached_tokens = 0;
  request.finish_reason = OgaFinishReason_None;
  request.policy = policy;
  request.stop = std::move(stop);
  request.guidance = std::move(guidance);
  request.status = RequestStatus::Assigned;
  if (enqueue) EnqueueWaiting(request);
  return request.turn_id;
}

bool Engine::CancelTurn(Request& request, uint64_t turn_id) {
  CheckOwnerThread();
  CheckNoStepInFlight("cancel a turn");
  if (request.turn_id == 0) throw ApiError("Cannot cancel a request before a turn has begun.");
  if (turn_id != request.turn_id || !request.executable()) return false;
  RemoveWaiting(request);
  PublishTerminal(request, OgaFinishReason_Cancelled, OgaErrorCode_None);
  return true;
}

void Engine::RewindToStartOfTurn(Request& request, uint64_t turn_id) {
  CheckOwnerThread();
  CheckNoStepInFlight("rewind a request");
  ReclaimAbandoned();
  if (request.closed()) throw ApiError("Cannot rewind a closed request.");
  if (request.status != RequestStatus::TurnComplete) {
    throw ApiError("Request rewind is only valid after the current turn is complete.");
  }
  if (request.retained_events > 0) {
    throw ApiError(
        "Cannot rewind a request while an Engine event is pending; call Engine::Run() to drain the event before "
        "rewinding.");
  }
  if (request.finish_reason == OgaFinishReason_Failed) throw ApiError("Cannot rewind a Request whose current turn failed.");
  // 0.18 checks residency (and the static batch's row count) before it looks the turn id up.
  if (request.processed > 0 && !request.resident()) {
    throw ApiError("Cannot rewind a request whose model state is no longer resident.");
  }
  if (static_batching() && request.static_row >= 0 && static_scheduler_->rows().size() != 1) {
    throw ApiError(
        "Static Engine Request rewind requires exactly one resident Request because a row cannot be released "
        "independently from its shared contiguous cache allocation.");
  }
  auto start = std::find_if(request.turn_starts.begin(), request.turn_starts.end(),
                            [turn_id](const std::pair<uint64_t, size_t>& entry) { return entry.first == turn_id; });
  if (turn_id == 0 || start == request.turn_starts.end()) {
    throw ApiError("Cannot rewind to unknown Turn ID " + std::to_string(turn_id) + ".");
  }
  Truncate(request, start->second);
}

void Engine::TruncateRequest(Request& request, size_t length) {
  CheckOwnerThread();
  CheckNoStepInFlight("truncate a request");
  ReclaimAbandoned();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (request.executable()) throw ApiError("A request can only be truncated between turns.");
  if (request.retained_events > 0) {
    throw ApiError("Cannot truncate a request while an Engine event is pending; call Engine::Run() to drain it first.");
  }
  if (length > request.tokens.size()) {
    throw ApiError("Cannot truncate a request of " + std::to_string(request.tokens.size()) + " tokens to " +
                   std::to_string(length) + ".");
  }
  if (static_batching() && request.static_row >= 0 && static_scheduler_->rows().size() != 1) {
    throw ApiError(
        "Static Engine Request rewind requires exactly one resident Request because a row cannot be released "
        "independently from its shared contiguous cache allocation.");
  }
  Truncate(request, length);
}

void Engine::Truncate(Request& request, size_t boundary) {
  // No allocation from here on: shrinking keeps capacity.
  request.tokens.resize(boundary);
  request.processed = std::min(request.processed, boundary);
  request.recompute_until = std::min(request.recompute_until, boundary);
  // Turns that began at or after the boundary are gone (turns start at strictly increasing lengths).
  auto first_gone = std::find_if(request.turn_starts.begin(), request.turn_starts.end(),
                                 [boundary](const std::pair<uint64_t, size_t>& entry) { return entry.second >= boundary; });
  request.turn_starts.erase(first_gone, request.turn_starts.end());
  if (static_batching()) {
    // The row's contiguous cache keeps its first `processed` positions; later ones are rewritten.
    for (StaticRow& row : static_scheduler_->rows()) {
      if (row.request.get() == &request) row.processed = request.processed;
    }
  } else {
    // As 0.18: the rewound request gives its blocks and its residency back, and its next turn
    // prefills the retained history again (admitted like a first turn; with prefix caching its full
    // blocks are adopted from the index instead of computed).
    scheduler_.Remove(request);
    cache_.Release(request);
    request.processed = 0;
  }
}

void Engine::AllowTokens(Request& request, uint32_t tokens) {
  CheckOwnerThread();
  CheckNoStepInFlight("pace a request");
  request.paced = true;
  request.allowance = tokens;
}

void Engine::HoldLogits(Request& request) {
  CheckOwnerThread();
  CheckNoStepInFlight("hold a request's logits");
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (!request.executable()) throw ApiError("Logits can only be held for a request whose turn is running.");
  if (request.logits_held) return;
  request.held_logits.resize(vocab_size_);  // before the flag: a failed allocation changes nothing
  request.hold_logits = true;
}

StagedResult Engine::StageHeldToken(Request& request) {
  CheckOwnerThread();
  CheckNoStepInFlight("select a held token");
  ThrowIfUnhealthy();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (!request.logits_held || request.status != RequestStatus::Active) {
    throw ApiError("The request holds no logits to select a token from.");
  }
  LogitsRow logits;
  logits.data = request.held_logits.data();
  logits.type = OgaExtLogitsType_Float32;
  try {
    // Selection only stages: a draw advances a copy of the stream, the guidance cursor moves at publish.
    return selector_.SelectFromLogits(request, logits, 0);
  } catch (const RetryableStepError&) {
    throw ApiError("No token can be selected: every logit is NaN or masked.");
  }
}

void Engine::CheckHeldTokenSelectable(Request& request) { (void)StageHeldToken(request); }

void Engine::SelectHeldToken(Request& request) {
  const StagedResult staged = StageHeldToken(request);
  request.logits_held = false;
  PublishToken(request, staged);
}

void Engine::ReserveWaitingSlot() {
  if (static_batching()) {
    static_scheduler_->ReserveWaitingSlot();
  } else {
    scheduler_.ReserveWaitingSlot();
  }
}

void Engine::EnqueueWaiting(Request& request) {
  if (static_batching()) {
    static_scheduler_->Enqueue(request);
  } else {
    scheduler_.Enqueue(request);
  }
}

void Engine::RemoveWaiting(Request& request) {
  if (!request.waiting) return;
  if (static_batching()) {
    static_scheduler_->RemoveWaiting(request);
  } else {
    scheduler_.Remove(request);
  }
}

void Engine::Close(Request& request) {
  CheckOwnerThread();
  CheckNoStepInFlight("close a request");
  CloseRequest(request);
}

void Engine::CheckNoStepInFlight(const char* what) const {
  // An executor callback that calls back into the engine must not change what the live
  // transaction reserved.
  if (in_step_) throw ApiError(std::string("Cannot ") + what + " while a step is in flight.");
}

void Engine::CloseRequest(Request& request) noexcept {
  if (request.closed()) return;
  if (static_batching()) {
    // A resident static row stays in the batch (it shares the contiguous cache allocation) with its
    // frozen input until the batch is recycled; only the logical request goes away now.
    static_scheduler_->RemoveWaiting(request);
  } else {
    scheduler_.Remove(request);
    cache_.Release(request);
  }
  pending_.RemoveRequest(&request);
  EndTurnState(request);
  request.status = RequestStatus::Closed;
  request.Detach();
  std::vector<int32_t>().swap(request.tokens);
  // Drop the engine's strong reference last: the caller may hold the only other one.
  auto it = std::find_if(bound_.begin(), bound_.end(),
                         [&request](const std::shared_ptr<Request>& bound) { return bound.get() == &request; });
  if (it != bound_.end()) {
    std::shared_ptr<Request> keep = std::move(*it);
    bound_.erase(it);
  }
}

void Engine::ReclaimAbandoned() {
  if (in_step_ || !abandonment_pending_.load(std::memory_order_acquire)) return;  // after the step
  abandonment_pending_.store(false, std::memory_order_relaxed);
  for (size_t i = bound_.size(); i > 0; --i) {
    if (i - 1 >= bound_.size()) continue;
    Request& request = *bound_[i - 1];
    if (request.abandoned.load(std::memory_order_acquire)) CloseRequest(request);
  }
}

void Engine::SetLastTurnIdForTesting(Request& request, uint64_t turn_id) {
  CheckOwnerThread();
  if (request.executable() || request.closed() || request.retained_events > 0) {
    throw ApiError("The last turn id can only be set on an idle request without pending events.");
  }
  request.turn_id = turn_id;
}

}  // namespace oga
