// Token selection for one step's rows (seed: "One dynamic step in detail", select and stage): each
// row's next token from its logits row, by the host sampler (guidance mask, logits processors,
// greedy or a draw with the row's SamplingParams), by the executor's device sampler, or by greedy
// verification of the row's caller-supplied drafts; then the turn-end staging (EOS, stop strings,
// the turn's and the session's caps). Selection only stages: nothing of a request changes until the
// engine publishes what was staged (Engine::PublishToken), so a rolled-back step leaves no trace.
//
// The selector owns what selection needs across steps: one sampling scratch and one stop-string
// scratch per participant of its row workers, the rows of the step being selected (preallocated at
// max_batch_size), and the device logits of executors whose device ops can read logits back.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/random_stream.h"
#include "base/row_workers.h"
#include "decoders/device_logits.h"
#include "oga/oga.h"
#include "oga/oga_ext.h"
#include "plan/step_plan.h"
#include "request/request.h"
#include "sampling/sampler.h"

namespace oga {

// At most this many tokens reach one request in one committed step (1 + kMaxDraftTokens).
constexpr size_t kMaxDraftTokens = 7;
constexpr size_t kMaxTokensPerStep = kMaxDraftTokens + 1;

// One row's selected tokens: one normally, up to kMaxTokensPerStep when drafts were verified
// (accepted drafts, then the correction or bonus token). EOS is never among them.
struct StagedResult {
  std::array<int32_t, kMaxTokensPerStep> tokens{};
  size_t count = 0;
  OgaFinishReason finish_reason = OgaFinishReason_None;
  bool drew = false;    // the row sampled: `stream` is the request's advanced random stream
  RandomStream stream;
  int32_t matched_stop_string = -1;
  int32_t eos_token = -1;  // the EOS id selected (finish_reason Eos)
  bool hold = false;       // a Generator holds the row's logits: nothing was selected
};

// One row to select: its request, the logits row it reads, where its result is staged, and its plan
// row (null on the static path; drafts to verify when draft_count > 0, whose accepted_drafts the
// verification sets).
struct SelectionRow {
  Request* request = nullptr;
  size_t logits_row = 0;
  StagedResult* staged = nullptr;
  RequestStepPlan* plan = nullptr;
};

// What selection counts (part of the engine's counters, which the selector is handed).
struct SelectionCounters {
  uint64_t device_sampled_rows = 0;
  uint64_t host_read_logits_rows = 0;
};

class TokenSelector {
 public:
  // `participants`: the row workers' size (1 selects on the calling thread only). `device_ops`: the
  // executor's device ops; the device path is used when DeviceLogits supports them, with room for
  // `device_logits_rows` logits rows. `counters` outlives the selector.
  TokenSelector(size_t vocab_size, std::vector<int32_t> eos_ids, size_t max_rows, size_t participants,
                const OgaExtDeviceOps* device_ops, size_t device_logits_rows, SelectionCounters& counters);

  // The rows of the next Select, at most max_rows; fill rows()[0, count).
  std::vector<SelectionRow>& rows() { return rows_; }
  // Selects and stages rows()[0, count) from `outputs` (the step's logits), sharing the rows among
  // the row workers. Throws RetryableStepError when a row has nothing selectable (every logit NaN),
  // DeviceError when the device fails, InterruptedError when a device callback was interrupted.
  void Select(size_t count, const OgaExtStepOutputs& outputs);
  // One row's selection from a logits row outside any step (a Generator's held logits), with
  // participant 0's scratches. Throws RetryableStepError when nothing is selectable.
  StagedResult SelectFromLogits(Request& request, const LogitsRow& logits, size_t participant);

  // Whether logits on the executor's device can be read (the device path exists).
  bool reads_device_logits() const { return device_ != nullptr; }
  // Every stop-string scratch holds at least `capacity` bytes (reserved when a turn begins, so that
  // selection does not allocate).
  void ReserveStopScratch(size_t capacity);

 private:
  StagedResult SelectRow(const SelectionRow& row, const OgaExtStepOutputs& outputs, size_t participant);
  // A Generator's held row keeps its logits instead of selecting.
  StagedResult SelectToken(Request& request, const LogitsRow& logits, size_t participant);
  // Greedy verification of a row's scheduled drafts against its per-token logits rows.
  StagedResult VerifyDrafts(const SelectionRow& row, const OgaExtStepOutputs& outputs, size_t participant);
  // The common end of a selection: EOS, then the token and the turn-end staging.
  void StageSelectedToken(Request& request, int32_t token, StagedResult& staged, size_t participant);
  // Whether appending `staged`'s last token ends the turn (stop string, then the turn's cap, then
  // the session's); grows the token storage so publication cannot allocate.
  bool StageTurnEnd(Request& request, StagedResult& staged, size_t participant);
  // Whether every row is greedy over the raw row (no processors, guidance, drafts or held logits):
  // with block maxima such rows are selected on the calling thread.
  bool OnlyPlainGreedy(size_t count) const;
  // Device logits: selects the rows the device sampler supports there, stages them, reads back the
  // logits rows the others need and moves those rows to the front of rows_; returns how many rows
  // are left for host selection.
  size_t SelectOnDevice(size_t count, const OgaExtStepOutputs& outputs);
  LogitsRow LogitsRowAt(const OgaExtStepOutputs& outputs, size_t row) const;

  const size_t vocab_size_;
  const std::vector<int32_t> eos_ids_;
  RowWorkers workers_;
  std::vector<SamplingScratch> scratches_;   // one per participant (the calling thread is 0)
  std::vector<std::string> stop_scratches_;  // one token's decoded text, per participant
  std::vector<SelectionRow> rows_;
  const OgaExtStepOutputs* outputs_ = nullptr;  // during Select
  std::unique_ptr<DeviceLogits> device_;
  std::vector<size_t> device_select_;  // rows_ index of each row of the device batch
  std::vector<size_t> host_select_;    // rows_ indexes selected on the host, ascending
  SelectionCounters& counters_;
};

}  // namespace oga
