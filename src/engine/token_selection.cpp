// Token selection after a step: each row's token from its logits (host sampler, guidance, stop
// strings, drafts) or on the executor's device, staged and then published.
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
#include "engine/engine_support.h"

namespace oga {
using engine_detail::NowNs;
using engine_detail::UsageOf;

Engine::StagedResult Engine::SelectToken(Request& request, const LogitsRow& logits, size_t participant) {
  if (request.hold_logits || request.logits_held) {
    // A Generator asked for this row's logits: keep them for the caller instead of selecting. Logits
    // still held from before a preemption (set_logits may have changed them) are kept as they are.
    StagedResult staged;
    staged.hold = true;
    if (!request.logits_held) LoadLogits(logits, vocab_size_, request.held_logits.data());
    return staged;
  }
  return SelectFromLogits(request, logits, participant);
}

Engine::StagedResult Engine::SelectFromLogits(Request& request, const LogitsRow& logits, size_t participant) {
  SamplingScratch& scratch = scratches_[participant];
  StagedResult staged;
  const TurnPolicy& policy = request.policy;
  const bool mask_eos = request.turn_generated_tokens < policy.min_generated_tokens;
  // Guidance masks the row first (before the EOS floor and the other processors, as in 0.18).
  const uint32_t* allowed = nullptr;
  if (request.guidance) {
    allowed = request.guidance->Mask();
    if (allowed == nullptr) {
      staged.finish_reason = OgaFinishReason_Failed;  // the grammar cursor is poisoned for good
      return staged;
    }
  }
  int32_t token;
  if (policy.greedy && !policy.processes_logits() && allowed == nullptr) {
    token = SelectGreedy(logits, vocab_size_, eos_ids_, mask_eos);  // no copy of the row needed
  } else {
    LoadLogits(logits, vocab_size_, scratch.logits.data());
    if (allowed != nullptr) ApplyAllowedMask(allowed, scratch);
    ProcessLogits(request.tokens, eos_ids_, mask_eos, policy.repetition_penalty, policy.no_repeat_ngram_size,
                  scratch);
    if (policy.greedy) {
      token = ArgMaxProcessed(scratch);  // a greedy step draws nothing
    } else {
      // Draw from a copy: the request's stream (or the turn's reseed) advances only at commit.
      staged.stream = policy.seed ? RandomStream(*policy.seed) : request.stream;
      staged.drew = true;
      token = SampleProcessed(policy.temperature, policy.top_k, policy.top_p, staged.stream, scratch);
    }
  }
  if (token < 0) {
    // The processors masked every token (e.g. a no-repeat n-gram of size 1 over a sequence that used
    // the whole vocabulary, or an EOS floor where the grammar allows only EOS). Retrying would stall
    // the batch forever, so the row falls back to the top raw logit the grammar allows, still
    // honouring the EOS floor when anything else is left.
    if (allowed != nullptr) {
      LoadLogits(logits, vocab_size_, scratch.logits.data());
      ApplyAllowedMask(allowed, scratch);
      token = ArgMaxProcessed(scratch);
      if (token < 0) {
        staged.finish_reason = OgaFinishReason_Failed;  // the grammar allows no token at all
        return staged;
      }
    } else {
      token = SelectGreedy(logits, vocab_size_, eos_ids_, mask_eos);
      if (token < 0) token = SelectGreedy(logits, vocab_size_, eos_ids_, false);
      if (token < 0) throw RetryableStepError("every logit of a row is NaN");
    }
  }
  StageSelectedToken(request, token, staged, participant);
  return staged;
}

void Engine::StageSelectedToken(Request& request, int32_t token, StagedResult& staged, size_t participant) {
  if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
    staged.finish_reason = OgaFinishReason_Eos;  // EOS is neither appended nor emitted
    staged.eos_token = token;
    return;
  }
  staged.tokens[staged.count++] = token;
  StageTurnEnd(request, staged, participant);
}

bool Engine::StageTurnEnd(Request& request, StagedResult& staged, size_t participant) {
  if (request.tokens.size() + staged.count > request.tokens.capacity()) {
    // Grow geometrically (before publication, where allocation may still fail safely) so a
    // request reallocates O(log length) times over its life.
    request.tokens.reserve(std::min<size_t>(std::max<size_t>(request.tokens.size() * 2, 64),
                                            static_cast<size_t>(request.max_session_tokens)));
  }
  const uint64_t generated = request.turn_generated_tokens + staged.count;
  const uint64_t length = request.tokens.size() + staged.count;
  // Precedence for one token: StopString > MaxGeneratedTokens > MaxSessionTokens.
  if (request.stop.enabled()) {
    staged.matched_stop_string = request.stop.Peek(staged.tokens.data(), staged.count, stop_scratches_[participant]);
  }
  if (staged.matched_stop_string >= 0) {
    staged.finish_reason = OgaFinishReason_StopString;
  } else if (request.policy.max_generated_tokens != 0 && generated >= request.policy.max_generated_tokens) {
    staged.finish_reason = OgaFinishReason_MaxGeneratedTokens;
  } else if (length >= request.max_session_tokens) {
    staged.finish_reason = OgaFinishReason_MaxSessionTokens;
  }
  return staged.finish_reason != OgaFinishReason_None;
}

void Engine::PublishToken(Request& request, const StagedResult& staged) {
  if (staged.hold) {
    request.hold_logits = false;
    request.logits_held = true;
    request.status = RequestStatus::Active;
    return;
  }
  if (request.paced && request.allowance > 0) --request.allowance;
  request.eos_token = staged.eos_token;
  if (staged.drew) {
    request.stream = staged.stream;
    request.policy.seed.reset();  // the turn's reseed is durable now
  }
  if (staged.finish_reason == OgaFinishReason_Failed) {
    PublishTerminal(request, OgaFinishReason_Failed, OgaErrorCode_RequestUnserviceable);
    return;
  }
  const bool finished = staged.finish_reason != OgaFinishReason_None;
  for (size_t i = 0; i < staged.count; ++i) {
    const int32_t token = staged.tokens[i];
    request.tokens.push_back(token);  // capacity ensured by StageTurnEnd
    ++request.turn_generated_tokens;
    if (request.stop.enabled()) request.stop.Advance(token);
    if (request.guidance) request.guidance->Consume(token);
  }
  if (finished) EndTurnState(request);
  request.status = finished ? RequestStatus::TurnComplete : RequestStatus::Active;
  request.finish_reason = staged.finish_reason;
  // One event per token; the last one carries the turn's end. EOS alone ends it in its own event.
  const size_t events = std::max<size_t>(staged.count, finished ? 1 : 0);
  for (size_t i = 0; i < events; ++i) {
    const bool last = i + 1 == events;
    const bool token = i < staged.count;
    EngineEvent event;
    event.request = request.shared_from_this();
    event.flags = (token ? OgaEngineEventFlag_Token : 0u) | (last && finished ? OgaEngineEventFlag_TurnFinished : 0u);
    event.turn_id = request.turn_id;
    event.token = token ? staged.tokens[i] : 0;
    if (last && finished) {
      event.finish_reason = staged.finish_reason;
      event.matched_stop_string_index = staged.matched_stop_string;
      event.usage = UsageOf(request);
    }
    pending_.Push(std::move(event));
  }
}

void Engine::EndTurnState(Request& request) noexcept {
  request.hold_logits = false;
  request.logits_held = false;
  request.stop.Clear();
  request.guidance.reset();
  request.draft_tokens.clear();  // any terminal boundary discards a pending proposal
  request.recomputing = false;
}

void Engine::StageResults(const OgaExtStepOutputs& outputs) {
  const bool per_token = executor_.per_token_logits();
  size_t count = 0;
  for (size_t r = 0; r < plan_.rows.size(); ++r) {
    const RequestStepPlan& row = plan_.rows[r];
    staged_[r] = StagedResult{};
    if (!row.samples) continue;  // partial prefill: progress without a token
    select_requests_[count] = row.request;
    select_logits_rows_[count] = per_token ? row.logits_index : r;
    select_staged_[count] = &staged_[r];
    select_rows_[count] = &row;
    ++count;
  }
  SelectTokens(count, outputs);
}

void Engine::SelectTokens(size_t count, const OgaExtStepOutputs& outputs) {
  if (outputs.logits_on_device != 0) count = SelectOnDevice(count, outputs);
  select_outputs_ = &outputs;
  const RowWorkers::Task task = [](void* context, size_t i, size_t participant) {
    Engine& engine = *static_cast<Engine*>(context);
    const RequestStepPlan* row = engine.select_rows_[i];
    if (row != nullptr && row->draft_count > 0) {
      *engine.select_staged_[i] =
          engine.VerifyDrafts(*engine.select_requests_[i], *row, *engine.select_outputs_, participant);
      return;
    }
    const LogitsRow logits = engine.LogitsRowAt(*engine.select_outputs_, engine.select_logits_rows_[i]);
    *engine.select_staged_[i] = engine.SelectToken(*engine.select_requests_[i], logits, participant);
  };
  // Plain greedy rows with the LM head's block maxima read a few KB each: waking the workers would
  // cost more than the rows (16 SmolLM2 rows: 52 us of engine time a step inline, 80 us shared).
  if (outputs.logits_block_maxima != nullptr && OnlyPlainGreedy(count)) {
    for (size_t i = 0; i < count; ++i) task(this, i, 0);
    return;
  }
  workers_.Run(count, task, this);
}

bool Engine::OnlyPlainGreedy(size_t count) const {
  for (size_t i = 0; i < count; ++i) {
    const Request& request = *select_requests_[i];
    const RequestStepPlan* row = select_rows_[i];
    if ((row != nullptr && row->draft_count > 0) || request.hold_logits || request.logits_held || request.guidance ||
        !request.policy.greedy || request.policy.processes_logits())
      return false;
  }
  return true;
}

size_t Engine::SelectOnDevice(size_t count, const OgaExtStepOutputs& outputs) {
  DeviceLogits& device = *device_logits_;
  device.ClearSamples();
  device.ClearReads();
  device_select_.clear();
  host_select_.clear();
  for (size_t i = 0; i < count; ++i) {
    const Request& request = *select_requests_[i];
    const TurnPolicy& policy = request.policy;
    const bool drafts = select_rows_[i] != nullptr && select_rows_[i]->draft_count > 0;
    // What the device sampler does not do (see OgaExtDeviceSampling) stays on the host.
    if (!device.can_sample() || drafts || request.guidance || policy.no_repeat_ngram_size > 0 ||
        request.hold_logits || request.logits_held) {
      host_select_.push_back(i);
      continue;
    }
    const RandomStream stream = policy.seed ? RandomStream(*policy.seed) : request.stream;
    device.AddSample(static_cast<int32_t>(select_logits_rows_[i]), policy.greedy ? 0.0f : policy.temperature,
                     policy.top_k, policy.top_p, stream.key(), stream.counter(),
                     request.turn_generated_tokens < policy.min_generated_tokens, policy.repetition_penalty,
                     request.tokens);
    device_select_.push_back(i);
  }
  const int32_t* tokens = device.Sample(outputs, eos_ids_);
  bool reordered = false;
  for (size_t j = 0; j < device_select_.size(); ++j) {
    const size_t i = device_select_[j];
    if (tokens[j] < 0) {
      // Nothing was left after masking: the host's fallbacks need the raw row.
      host_select_.push_back(i);
      reordered = true;
      continue;
    }
    Request& request = *select_requests_[i];
    StagedResult& staged = *select_staged_[i];
    staged = StagedResult{};
    if (!request.policy.greedy) {
      staged.stream = device.StreamAfterDraw(j);
      staged.drew = true;
    }
    StageSelectedToken(request, tokens[j], staged, 0);
    ++counters_.device_sampled_rows;
  }
  if (reordered) std::sort(host_select_.begin(), host_select_.end());
  // Read back what the host rows need, in one call.
  for (const size_t i : host_select_) {
    const RequestStepPlan* row = select_rows_[i];
    const size_t rows = row != nullptr && row->draft_count > 0 ? row->draft_count + 1 : 1;
    for (size_t k = 0; k < rows; ++k) device.MarkRead(select_logits_rows_[i] + k, outputs.logits_rows);
  }
  device.Read(outputs);
  counters_.host_read_logits_rows += device.read_count();
  // Host rows to the front, in order (host_select_[k] >= k, so nothing is overwritten unread).
  for (size_t k = 0; k < host_select_.size(); ++k) {
    const size_t i = host_select_[k];
    select_requests_[k] = select_requests_[i];
    select_logits_rows_[k] = select_logits_rows_[i];
    select_staged_[k] = select_staged_[i];
    select_rows_[k] = select_rows_[i];
  }
  return host_select_.size();
}

void Engine::CheckFixedStateReservation() const {
  const FixedStatePool* pool = cache_.fixed_state();
  const FixedStatePlan& planned = plan_.fixed_state;
  if (planned.required != (pool != nullptr)) {
    throw ContractError("the step plan's fixed-state requirement does not match the model");
  }
  if (pool == nullptr) return;
  if (!pool->reservation_live() || pool->reserved_rows() != planned.rows || planned.rows != plan_.rows.size() ||
      pool->reserved_new_slots() != planned.new_slots || pool->reserved_binding_bytes() != planned.binding_bytes) {
    throw ContractError("the fixed-state reservation does not match the planned fixed-state resources");
  }
  for (size_t r = 0; r < plan_.rows.size(); ++r) {
    if (pool->reserved_owner(r) != plan_.rows[r].request) {
      throw ContractError("a fixed-state reservation row names another request than the plan");
    }
  }
}

}  // namespace oga
