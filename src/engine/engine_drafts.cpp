// Caller-supplied speculative drafts (seed: "Caller-supplied speculative drafts"):
// admission of a proposal and the verification telemetry. The greedy verification of the scheduled
// drafts with the per-token logits of one model run is the token selector's (TokenSelector::
// VerifyDrafts); scheduling, packing, reservation narrowing and publication live with the rest of
// the step transaction.
#include <algorithm>
#include <string>

#include "engine/engine.h"

namespace oga {

void Engine::SetDraftTokens(Request& request, const int32_t* tokens, size_t count) {
  CheckOwnerThread();
  ReclaimAbandoned();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (in_step_) throw ApiError("Cannot replace draft tokens while a step is in flight.");
  // 0.18's order: an empty proposal clears in any state, and an engine that cannot verify drafts
  // says so only after the request's state and turn policy were checked.
  if (count == 0) {
    request.draft_tokens.clear();
    return;
  }
  // A request preempted while decoding (recomputing its cache, a token of this turn already out) is
  // still decoding as far as its caller can tell; its proposal is dropped when the recompute samples
  // the token it was meant to follow. One preempted during its prompt's prefill is not ready yet.
  const bool preempted_decode = request.recomputing && request.turn_generated_tokens > 0;
  if (request.status != RequestStatus::Active && !preempted_decode) {
    throw ApiError("Speculative draft tokens may only be proposed when the request is ready to decode.");
  }
  const TurnPolicy& policy = request.policy;
  auto check_policy = [&request, &policy] {
    if (policy.repetition_penalty != 1.0f || policy.no_repeat_ngram_size != 0 ||
        request.turn_generated_tokens < policy.min_generated_tokens) {
      throw ApiError(
          "Speculative draft tokens require repetition_penalty 1, no_repeat_ngram_size 0, and a turn already past "
          "its minimum generated token count.");
    }
  };
  if (max_draft_tokens() == 0) {
    check_policy();
    throw ApiError("This engine does not support speculative draft verification.");
  }
  if (count > max_draft_tokens()) {
    throw ApiError("A step accepts at most " + std::to_string(max_draft_tokens()) + " draft tokens.");
  }
  if (request.guidance) throw ApiError("Speculative draft tokens are not supported with guidance.");
  check_policy();
  if (!policy.greedy) {
    if (policy.top_k <= 0) throw ApiError("Sampled speculative draft tokens require a positive top_k.");
    throw ApiError(
        "Speculative draft verification of sampled turns is not supported yet by oga; verify drafts on greedy turns.");
  }
  for (size_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || static_cast<size_t>(tokens[i]) >= vocab_size_) {
      throw ApiError("draft_tokens[" + std::to_string(i) + "] (" + std::to_string(tokens[i]) +
                     ") is outside the model's vocabulary [0, " + std::to_string(vocab_size_) + ").");
    }
  }
  if (request.draft_tokens.capacity() < kMaxDraftTokens) request.draft_tokens.reserve(kMaxDraftTokens);
  request.draft_tokens.assign(tokens, tokens + count);  // within capacity: cannot fail now
  speculative_.draft_tokens_proposed += count;
}

void Engine::CountVerification(const RequestStepPlan& row, const StagedResult& staged) {
  SpeculativeCounters& s = speculative_;
  ++s.rounds;
  s.draft_tokens_evaluated += row.draft_count;
  s.draft_tokens_accepted += row.accepted_drafts;
  s.tokens_emitted += staged.count;
  // The token after the accepted drafts: a bonus when every draft held, else a correction (none
  // when the turn ended on an accepted draft or on EOS).
  if (staged.count > row.accepted_drafts) {
    ++(row.accepted_drafts == row.draft_count ? s.bonus_tokens : s.correction_tokens);
  }
  ++(row.accepted_drafts == row.draft_count ? s.full_accept_rounds
     : row.accepted_drafts == 0             ? s.zero_accept_rounds
                                            : s.partial_accept_rounds);
  ++s.acceptance_length_histogram[std::min<size_t>(row.accepted_drafts, s.acceptance_length_histogram.size() - 1)];
}

}  // namespace oga
