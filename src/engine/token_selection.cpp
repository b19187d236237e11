// After token selection (token_selector.cpp): the staged results published to their requests and
// events, and the fixed-state reservation's check.
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
    request.tokens.push_back(token);  // capacity ensured by TokenSelector::StageTurnEnd
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
  std::vector<SelectionRow>& rows = selector_.rows();
  size_t count = 0;
  for (size_t r = 0; r < plan_.rows.size(); ++r) {
    RequestStepPlan& row = plan_.rows[r];
    staged_[r] = StagedResult{};
    if (!row.samples) continue;  // partial prefill: progress without a token
    rows[count++] = SelectionRow{row.request, per_token ? row.logits_index : r, &staged_[r], &row};
  }
  selector_.Select(count, outputs);
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
