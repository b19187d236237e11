// The static batching path (models without engine.dynamic_batching: contiguous per-row caches).
//
// StaticBatchScheduler forms a batch of up to max_batch_size queued requests in submission order
// and keeps it resident until every row's turn has ended and new work is queued; then the batch is
// recycled (residents lose their cache) and the next batch is prefilled. Nothing joins a resident
// batch. Every resident row takes part in every step: rows whose turn ended (or that were closed)
// are fed their frozen input and produce no events, because the rows share one contiguous cache
// allocation. A single-row batch may continue with a new turn while it is resident. Rows a
// Generator paused (Request::schedulable() false) are fed like rows whose turn ended. A frozen
// input rewrites the same KV slot every step, but it advances fixed decoder state (LFM2's conv
// layers, which the static executor keeps per row); on the static path a Generator's rows step
// together (no chunked prefill, every row admitted at once), so no row resumes after a frozen step.
//
// StaticBatchDecoderIO packs a step: right-padded input_ids [rows, S], their positions [rows, S]
// and an attention_mask [rows, T] of ones followed by zeros, in buffers allocated once at the
// configured limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "oga/oga_ext.h"

namespace oga {

class Request;

struct StaticRow {
  std::shared_ptr<Request> request;  // keeps the physical row alive until the batch is recycled
  size_t processed = 0;              // tokens in the row's cache
  int32_t frozen_token = 0;          // what the row is fed once its turn ended (or it was closed)
};

enum class StaticStepKind {
  None,          // nothing executable
  PrefillBatch,  // a new batch: every row's prompt, right-padded
  Continue,      // the single resident row's new turn
  Decode,        // one token per row
};

class StaticBatchScheduler {
 public:
  StaticBatchScheduler(size_t max_batch_size, int32_t pad_token_id)
      : max_batch_size_(max_batch_size), pad_token_id_(pad_token_id) {}

  void ReserveWaitingSlot();
  void Enqueue(Request& request);
  // Removes a queued request; resident rows stay (they are physically part of the batch).
  void RemoveWaiting(Request& request);
  bool HasExecutableWork() const;
  // Decides the next step. PrefillBatch first recycles the previous batch and admits the next one.
  StaticStepKind PlanStep();

  std::vector<StaticRow>& rows() { return rows_; }
  const std::vector<StaticRow>& rows() const { return rows_; }
  const std::vector<Request*>& waiting() const { return waiting_; }
  size_t max_batch_size() const { return max_batch_size_; }
  // Drops the resident batch (engine teardown).
  void Clear();

 private:
  bool AnyRowExecutable() const;
  void RecycleAndAdmit();

  size_t max_batch_size_;
  int32_t pad_token_id_;
  std::vector<StaticRow> rows_;
  std::vector<Request*> waiting_;
};

class StaticBatchDecoderIO {
 public:
  StaticBatchDecoderIO(size_t max_rows, size_t max_sequence_length, int32_t pad_token_id);

  const OgaExtStaticStepInputs& Pack(StaticStepKind kind, const std::vector<StaticRow>& rows);

 private:
  size_t max_sequence_length_;
  int32_t pad_token_id_;
  std::vector<int64_t> input_ids_;
  std::vector<int64_t> attention_mask_;
  std::vector<int64_t> position_ids_;
  std::vector<int32_t> logits_positions_;
  OgaExtStaticStepInputs inputs_{};
};

}  // namespace oga
