#include "scheduler/static_batch.h"

#include <algorithm>

#include "base/errors.h"
#include "request/request.h"

namespace oga {

void StaticBatchScheduler::ReserveWaitingSlot() {
  if (waiting_.size() == waiting_.capacity()) waiting_.reserve(waiting_.empty() ? 16 : waiting_.size() * 2);
}

void StaticBatchScheduler::Enqueue(Request& request) {
  waiting_.push_back(&request);
  request.waiting = true;
}

void StaticBatchScheduler::RemoveWaiting(Request& request) {
  if (!request.waiting) return;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &request));
  request.waiting = false;
}

bool StaticBatchScheduler::AnyRowExecutable() const {
  for (const StaticRow& row : rows_) {
    if (row.request->schedulable()) return true;
  }
  return false;
}

bool StaticBatchScheduler::HasExecutableWork() const { return !waiting_.empty() || AnyRowExecutable(); }

StaticStepKind StaticBatchScheduler::PlanStep() {
  // A batch whose prefill has not committed yet (a retryable failure) prefills again.
  if (!rows_.empty() && rows_.front().processed == 0 && AnyRowExecutable()) return StaticStepKind::PrefillBatch;
  for (const StaticRow& row : rows_) {
    if (row.request->status == RequestStatus::Assigned && row.request->schedulable()) return StaticStepKind::Continue;
  }
  if (AnyRowExecutable()) return StaticStepKind::Decode;
  if (waiting_.empty()) return StaticStepKind::None;
  RecycleAndAdmit();
  return StaticStepKind::PrefillBatch;
}

void StaticBatchScheduler::RecycleAndAdmit() {
  for (StaticRow& row : rows_) row.request->static_row = -1;  // its cache is gone
  rows_.clear();
  const size_t admitted = std::min(max_batch_size_, waiting_.size());
  rows_.reserve(max_batch_size_);
  for (size_t i = 0; i < admitted; ++i) {
    Request& request = *waiting_[i];
    request.waiting = false;
    request.static_row = static_cast<int32_t>(i);
    StaticRow row;
    row.request = request.shared_from_this();
    row.frozen_token = pad_token_id_;
    rows_.push_back(std::move(row));
  }
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(admitted));
}

void StaticBatchScheduler::Clear() {
  for (StaticRow& row : rows_) row.request->static_row = -1;
  rows_.clear();
  for (Request* request : waiting_) request->waiting = false;
  waiting_.clear();
}

StaticBatchDecoderIO::StaticBatchDecoderIO(size_t max_rows, size_t max_sequence_length, int32_t pad_token_id)
    : max_sequence_length_(max_sequence_length),
      pad_token_id_(pad_token_id),
      input_ids_(max_rows * max_sequence_length),
      attention_mask_(max_rows * max_sequence_length),
      position_ids_(max_rows * max_sequence_length),
      logits_positions_(max_rows) {}

const OgaExtStaticStepInputs& StaticBatchDecoderIO::Pack(StaticStepKind kind, const std::vector<StaticRow>& rows) {
  // Query length and mask width of the step.
  size_t query = 1;
  size_t total = 0;
  for (const StaticRow& row : rows) {
    const Request& request = *row.request;
    if (request.closed()) {
      total = std::max(total, row.processed + 1);
    } else if (kind == StaticStepKind::PrefillBatch) {
      query = std::max(query, request.tokens.size());
      total = std::max(total, query);
    } else if (kind == StaticStepKind::Continue && request.status == RequestStatus::Assigned &&
               request.schedulable()) {
      query = request.unprocessed();
      total = std::max(total, request.tokens.size());
    } else {
      total = std::max(total, row.processed + 1);
    }
  }
  if (rows.size() * query > input_ids_.size() || rows.size() * total > attention_mask_.size() ||
      total > max_sequence_length_) {
    throw ContractError("a static step exceeds the contiguous cache (search.max_length)");
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const StaticRow& row = rows[r];
    const Request& request = *row.request;
    int64_t* ids = input_ids_.data() + r * query;
    int64_t* mask = attention_mask_.data() + r * total;
    int64_t* positions = position_ids_.data() + r * query;
    size_t fed = 1;      // real tokens in this row's query
    size_t length = 0;   // ones in this row's mask
    const bool open = !request.closed();
    if (open && kind == StaticStepKind::PrefillBatch) {
      fed = request.tokens.size();
      std::copy(request.tokens.begin(), request.tokens.end(), ids);
      length = fed;
    } else if (open && kind == StaticStepKind::Continue && request.status == RequestStatus::Assigned &&
               request.schedulable()) {
      fed = request.unprocessed();
      std::copy(request.tokens.begin() + static_cast<std::ptrdiff_t>(request.processed), request.tokens.end(), ids);
      length = request.tokens.size();
    } else if (open && request.status == RequestStatus::Active && request.schedulable()) {
      ids[0] = request.tokens[request.processed];
      length = row.processed + 1;
    } else {
      // Rows whose turn ended, rows a Generator paused, and closed rows (which keep only this
      // row-essential state), rewrite
      // their own next slot with a frozen input: they still share the batch's cache allocation, but
      // nothing they compute is read.
      ids[0] = row.frozen_token;
      length = row.processed + 1;
    }
    std::fill(ids + fed, ids + query, static_cast<int64_t>(pad_token_id_));
    // The query's first token sits at position length - fed; padding continues the count, which
    // stays below `total` (<= max_sequence_length) for every row.
    for (size_t i = 0; i < query; ++i) positions[i] = static_cast<int64_t>(length - fed + i);
    std::fill(mask, mask + length, int64_t{1});
    std::fill(mask + length, mask + total, int64_t{0});
    logits_positions_[r] = static_cast<int32_t>(fed - 1);
  }
  inputs_.batch_size = rows.size();
  inputs_.sequence_length = query;
  inputs_.total_sequence_length = total;
  inputs_.input_ids = input_ids_.data();
  inputs_.attention_mask = attention_mask_.data();
  inputs_.logits_positions = logits_positions_.data();
  inputs_.position_ids = position_ids_.data();
  inputs_.new_batch = kind == StaticStepKind::PrefillBatch ? 1 : 0;
  return inputs_;
}

}  // namespace oga
