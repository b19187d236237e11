#include "engine/token_selector.h"

#include <algorithm>
#include <utility>

#include "base/errors.h"

namespace oga {

TokenSelector::TokenSelector(size_t vocab_size, std::vector<int32_t> eos_ids, size_t max_rows, size_t participants,
                             const OgaExtDeviceOps* device_ops, size_t device_logits_rows, SelectionCounters& counters)
    : vocab_size_(vocab_size), eos_ids_(std::move(eos_ids)), workers_(participants), rows_(max_rows),
      counters_(counters) {
  scratches_.reserve(workers_.participants());
  for (size_t p = 0; p < workers_.participants(); ++p) scratches_.emplace_back(vocab_size_);
  stop_scratches_.resize(workers_.participants());
  if (DeviceLogits::Supported(device_ops)) {
    device_ = std::make_unique<DeviceLogits>(device_ops, max_rows, device_logits_rows, vocab_size_);
    device_select_.reserve(max_rows);
    host_select_.reserve(max_rows);
  }
}

void TokenSelector::ReserveStopScratch(size_t capacity) {
  for (std::string& scratch : stop_scratches_) scratch.reserve(capacity);
}

void TokenSelector::Select(size_t count, const OgaExtStepOutputs& outputs) {
  if (outputs.logits_on_device != 0) count = SelectOnDevice(count, outputs);
  outputs_ = &outputs;
  const RowWorkers::Task task = [](void* context, size_t i, size_t participant) {
    TokenSelector& selector = *static_cast<TokenSelector*>(context);
    const SelectionRow& row = selector.rows_[i];
    *row.staged = selector.SelectRow(row, *selector.outputs_, participant);
  };
  // Plain greedy rows with the LM head's block maxima read a few KB each: waking the workers would
  // cost more than the rows (16 SmolLM2 rows: 52 us of engine time a step inline, 80 us shared).
  if (outputs.logits_block_maxima != nullptr && OnlyPlainGreedy(count)) {
    for (size_t i = 0; i < count; ++i) task(this, i, 0);
    return;
  }
  workers_.Run(count, task, this);
}

StagedResult TokenSelector::SelectRow(const SelectionRow& row, const OgaExtStepOutputs& outputs,
                                      size_t participant) {
  if (row.plan != nullptr && row.plan->draft_count > 0) return VerifyDrafts(row, outputs, participant);
  return SelectToken(*row.request, LogitsRowAt(outputs, row.logits_row), participant);
}

StagedResult TokenSelector::SelectToken(Request& request, const LogitsRow& logits, size_t participant) {
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

StagedResult TokenSelector::SelectFromLogits(Request& request, const LogitsRow& logits, size_t participant) {
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
    ProcessLogits(request.tokens, eos_ids_, mask_eos, policy, scratch);
    if (policy.greedy) {
      token = ArgMaxProcessed(scratch);  // a greedy step draws nothing
    } else {
      // Draw from a copy: the request's stream (or the turn's reseed) advances only at commit.
      staged.stream = policy.seed ? RandomStream(*policy.seed) : request.stream;
      staged.drew = true;
      token = SampleProcessed(policy, staged.stream, scratch);
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

StagedResult TokenSelector::VerifyDrafts(const SelectionRow& row, const OgaExtStepOutputs& outputs,
                                         size_t participant) {
  // Admission rules (Engine::SetDraftTokens) keep this row greedy and free of logits processors,
  // guidance and the EOS floor, so the target token of each position is its top raw logit.
  Request& request = *row.request;
  RequestStepPlan& plan = *row.plan;
  StagedResult staged;
  size_t accepted = 0;
  for (size_t i = 0; i <= plan.draft_count; ++i) {
    const int32_t target = SelectGreedy(LogitsRowAt(outputs, plan.logits_index + i), vocab_size_, eos_ids_, false);
    if (target < 0) throw RetryableStepError("every logit of a row is NaN");
    if (std::find(eos_ids_.begin(), eos_ids_.end(), target) != eos_ids_.end()) {
      staged.finish_reason = OgaFinishReason_Eos;  // after the accepted drafts, in their last event
      break;
    }
    staged.tokens[staged.count++] = target;
    // A turn that ends on an accepted draft keeps it as its pending (unprocessed) token, as a
    // turn's last token always is; later drafts are discarded.
    if (StageTurnEnd(request, staged, participant)) break;
    if (i == plan.draft_count || target != request.draft_tokens[i]) break;  // bonus, or correction
    ++accepted;
  }
  plan.accepted_drafts = accepted;
  return staged;
}

void TokenSelector::StageSelectedToken(Request& request, int32_t token, StagedResult& staged, size_t participant) {
  if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
    staged.finish_reason = OgaFinishReason_Eos;  // EOS is neither appended nor emitted
    staged.eos_token = token;
    return;
  }
  staged.tokens[staged.count++] = token;
  StageTurnEnd(request, staged, participant);
}

bool TokenSelector::StageTurnEnd(Request& request, StagedResult& staged, size_t participant) {
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

bool TokenSelector::OnlyPlainGreedy(size_t count) const {
  for (size_t i = 0; i < count; ++i) {
    const Request& request = *rows_[i].request;
    const RequestStepPlan* plan = rows_[i].plan;
    if ((plan != nullptr && plan->draft_count > 0) || request.hold_logits || request.logits_held ||
        request.guidance || !request.policy.greedy || request.policy.processes_logits())
      return false;
  }
  return true;
}

size_t TokenSelector::SelectOnDevice(size_t count, const OgaExtStepOutputs& outputs) {
  DeviceLogits& device = *device_;
  device.ClearSamples();
  device.ClearReads();
  device_select_.clear();
  host_select_.clear();
  for (size_t i = 0; i < count; ++i) {
    const Request& request = *rows_[i].request;
    const TurnPolicy& policy = request.policy;
    const bool drafts = rows_[i].plan != nullptr && rows_[i].plan->draft_count > 0;
    // What the device sampler does not do (see OgaExtDeviceSampling) stays on the host.
    if (!device.can_sample() || drafts || request.guidance || policy.no_repeat_ngram_size > 0 ||
        request.hold_logits || request.logits_held) {
      host_select_.push_back(i);
      continue;
    }
    const RandomStream stream = policy.seed ? RandomStream(*policy.seed) : request.stream;
    device.AddSample(static_cast<int32_t>(rows_[i].logits_row), policy, stream.key(), stream.counter(),
                     request.turn_generated_tokens < policy.min_generated_tokens, request.tokens);
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
    Request& request = *rows_[i].request;
    StagedResult& staged = *rows_[i].staged;
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
    const RequestStepPlan* plan = rows_[i].plan;
    const size_t rows = plan != nullptr && plan->draft_count > 0 ? plan->draft_count + 1 : 1;
    for (size_t k = 0; k < rows; ++k) device.MarkRead(rows_[i].logits_row + k, outputs.logits_rows);
  }
  device.Read(outputs);
  counters_.host_read_logits_rows += device.read_count();
  // Host rows to the front, in order (host_select_[k] >= k, so nothing is overwritten unread).
  for (size_t k = 0; k < host_select_.size(); ++k) rows_[k] = rows_[host_select_[k]];
  return host_select_.size();
}

LogitsRow TokenSelector::LogitsRowAt(const OgaExtStepOutputs& outputs, size_t row) const {
  if (outputs.logits_on_device != 0) return device_->HostRow(row, outputs.logits_type);
  const size_t element_size = outputs.logits_type == OgaExtLogitsType_Float16 ? 2 : 4;
  LogitsRow logits;
  logits.data = static_cast<const char*>(outputs.logits) + row * outputs.logits_row_stride * element_size;
  logits.type = outputs.logits_type;
  if (outputs.logits_block_maxima != nullptr)
    logits.block_maxima = outputs.logits_block_maxima + row * outputs.logits_block_maxima_stride;
  return logits;
}

}  // namespace oga
