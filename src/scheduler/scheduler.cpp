#include "scheduler/scheduler.h"

#include <algorithm>

#include "request/request.h"

namespace oga {

struct DynamicBatchScheduler::Budget {
  size_t free_blocks = 0;
  size_t running_residents = 0;  // executable residents (admission headroom; with preemption only)
  size_t tokens = 0;
  size_t new_admissions = 0;
};

DynamicBatchScheduler::DynamicBatchScheduler(const SchedulerLimits& limits, PagedKeyValueCache& cache)
    : limits_(limits), cache_(cache) {
  residents_.reserve(limits.max_batch_size);
}

void DynamicBatchScheduler::Enqueue(Request& request) {
  waiting_.push_back(&request);
  request.waiting = true;
}

void DynamicBatchScheduler::EnqueueFront(Request& request) {
  waiting_.insert(waiting_.begin(), &request);  // capacity reserved by ReserveWaitingSlot
  request.waiting = true;
}

Request* DynamicBatchScheduler::PreemptionVictim() const {
  // Running residents, newest first, sparing the oldest: it alone is guaranteed to progress.
  const Request* oldest_running = nullptr;
  for (const Request* request : residents_) {
    if (request->executable()) {
      oldest_running = request;
      break;
    }
  }
  for (size_t i = residents_.size(); i > 0; --i) {
    Request* request = residents_[i - 1];
    if (request == oldest_running) break;
    if (request->executable()) return request;
  }
  // Then the idle: turn-complete residents hold blocks and a residency slot that nobody uses now.
  for (Request* request : residents_) {
    if (request->status == RequestStatus::TurnComplete) return request;
  }
  return nullptr;
}

void DynamicBatchScheduler::Remove(Request& request) {
  if (request.waiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &request));
    request.waiting = false;
  }
  auto resident = std::find(residents_.begin(), residents_.end(), &request);
  if (resident != residents_.end()) residents_.erase(resident);
}

bool DynamicBatchScheduler::HasExecutableWork() const {
  for (const Request* request : waiting_) {
    if (request->schedulable()) return true;
  }
  for (const Request* request : residents_) {
    if (request->schedulable()) return true;
  }
  return false;
}

bool DynamicBatchScheduler::HasSchedulableWaiting() const {
  for (const Request* request : waiting_) {
    if (request->schedulable()) return true;
  }
  return false;
}

void DynamicBatchScheduler::PlanStep(StepPlan& plan, bool admit) const {
  plan.Reset();
  Budget budget;
  budget.free_blocks = cache_.free_blocks();
  if (limits_.preemption) {
    for (const Request* request : residents_) budget.running_residents += request->executable() ? 1 : 0;
  }
  bool more = true;
  bool any_candidate = false;
  // Requests a Generator paused (schedulable() false) are skipped: they keep their place.
  for (Request* request : residents_) {
    if (!more) break;
    if (request->status != RequestStatus::Active || !request->schedulable()) continue;
    any_candidate = true;
    more = Consider(*request, false, false, budget, plan);
  }
  for (Request* request : residents_) {
    if (!more) break;
    if (request->status != RequestStatus::Assigned || !request->schedulable()) continue;
    any_candidate = true;
    more = Consider(*request, false, true, budget, plan);
  }
  if (!admit && HasSchedulableWaiting()) {
    any_candidate = true;
    plan.capacity_deferred = true;
  }
  for (Request* request : waiting_) {
    if (!more || !admit) break;
    if (!request->schedulable()) continue;
    any_candidate = true;
    more = Consider(*request, true, true, budget, plan);
  }
  if (!plan.unserviceable.empty()) {
    plan.outcome = StepOutcome::UnserviceableRequest;
    return;
  }
  if (plan.rows.empty()) {
    plan.outcome = any_candidate ? StepOutcome::CapacityDeferred : StepOutcome::NoWork;
    return;
  }
  ScheduleDrafts(budget, plan);
  ExpandPrefills(plan);
  OrderByFixedSlot(plan);
  AssignPackedLayout(plan);
  plan.outcome = StepOutcome::Executable;
}

bool DynamicBatchScheduler::Consider(Request& request, bool newly_admitted, bool prefill, Budget& budget,
                                     StepPlan& plan) const {
  if (plan.rows.size() == limits_.max_batch_size || budget.tokens == limits_.max_scheduled_tokens) {
    plan.capacity_deferred = true;
    return false;
  }
  // A prefill's blocks cover its whole unprocessed input; a decode grows by the one slot it writes.
  const size_t reserve_slots = prefill ? request.tokens.size() : request.processed + 1;
  const size_t owned = cache_.OwnedBlocks(request);
  const size_t blocks_after = std::max(owned, cache_.BlocksFor(reserve_slots));
  if (blocks_after > limits_.max_block_table_columns || blocks_after > cache_.total_blocks()) {
    plan.unserviceable.push_back(&request);
    return true;
  }
  // A new prompt adopts the cached blocks it starts with, leaving at least one token to execute.
  const size_t cached_begin = plan.cached_block_ids.size();
  size_t cached = 0;
  size_t cached_evictable = 0;  // adopted blocks that count against the free budget
  if (newly_admitted && cache_.prefix_caching()) {
    const size_t block_size = cache_.block_size();
    const size_t limit = std::min((request.tokens.size() - 1) / block_size, blocks_after);
    int32_t parent = -1;
    for (; cached < limit; ++cached) {
      const int32_t block = cache_.FindCached(parent, request.tokens.data() + cached * block_size);
      if (block < 0) break;
      plan.cached_block_ids.push_back(block);  // capacity reserved for a full step
      parent = block;
    }
    // Hybrid models: only as far as a fixed-state checkpoint (the state after the last adopted block).
    while (cached > 0 && !cache_.AdoptableWithFixedState(plan.cached_block_ids[cached_begin + cached - 1])) {
      --cached;
      plan.cached_block_ids.pop_back();
    }
    for (size_t i = 0; i < cached; ++i) {
      const int32_t block = plan.cached_block_ids[cached_begin + i];
      if (cache_.evictable(block) &&
          std::find(plan.cached_block_ids.begin(), plan.cached_block_ids.begin() + cached_begin, block) ==
              plan.cached_block_ids.begin() + cached_begin) {
        ++cached_evictable;  // not yet adopted by an earlier row of this step
      }
    }
    // Cache-aware admission: when a request still prefilling (resident, or admitted earlier in this
    // plan) is computing more of this prompt's blocks than the index holds, wait for them to be
    // indexed instead of computing the same blocks again.
    if (cached < limit && SharesPendingPrefix(request, cached, limit, plan)) {
      plan.cached_block_ids.resize(cached_begin);
      return true;  // not a capacity shortage: later candidates are still considered
    }
  }
  if (newly_admitted) {
    // Every committed resident, turn-complete ones included, holds a residency slot.
    const size_t residents = residents_.size();
    if (residents + budget.new_admissions >= limits_.max_batch_size) {
      plan.capacity_deferred = true;
      return false;  // no later waiting request can be admitted either
    }
  }
  const size_t new_blocks = blocks_after - owned - cached;
  // With preemption, a new prompt also leaves one free block per running request (this step's
  // earlier admissions included): admitting into the last blocks the decodes are about to grow into
  // only preempts (and recomputes) it again. Without running residents nothing is held back, so a
  // prompt that needs the whole pool is still admitted once the pool is free.
  const size_t running = budget.running_residents + budget.new_admissions;
  const size_t headroom = newly_admitted && limits_.preemption && running > 0 ? running : 0;
  if (new_blocks + cached_evictable + headroom > budget.free_blocks) {
    plan.cached_block_ids.resize(cached_begin);
    plan.capacity_deferred = true;
    if (!newly_admitted) ++plan.deferred_residents;
    // With preemption, admission is first come, first served: a steady stream of small prompts
    // must not starve a large one (or a preempted request waiting to recompute) forever.
    if (newly_admitted && limits_.preemption) return false;
    return true;  // a smaller later candidate may still fit
  }
  RequestStepPlan row;
  row.request = &request;
  row.processed_before = request.processed + cached * cache_.block_size();
  row.cached_blocks = cached;
  row.cached_begin = cached_begin;
  row.remaining_tokens = request.tokens.size() - row.processed_before;
  row.token_count = 1;
  row.reserve_slots = reserve_slots;
  row.blocks_after = blocks_after;
  row.new_blocks = new_blocks;
  row.prefill = prefill;
  row.newly_admitted = newly_admitted;
  plan.rows.push_back(row);
  plan.new_blocks += new_blocks;
  budget.free_blocks -= new_blocks + cached_evictable;
  budget.tokens += 1;
  if (newly_admitted) ++budget.new_admissions;
  return true;
}

bool DynamicBatchScheduler::SharesPendingPrefix(const Request& request, size_t cached_blocks, size_t limit_blocks,
                                                const StepPlan& plan) const {
  const size_t block_size = cache_.block_size();
  auto pending = [&](const Request& other) {
    if (&other == &request || other.processed >= other.tokens.size()) return false;
    // Full blocks both prompts share beyond what the index already offers, not yet committed by
    // `other` (its processed tokens were indexed when their blocks filled).
    const size_t needed = (cached_blocks + 1) * block_size;
    if (other.tokens.size() < needed || other.processed >= needed) return false;
    return std::equal(request.tokens.begin(), request.tokens.begin() + static_cast<std::ptrdiff_t>(needed),
                      other.tokens.begin());
  };
  if (cached_blocks >= limit_blocks) return false;
  for (const Request* resident : residents_) {
    if (resident->status == RequestStatus::Assigned && pending(*resident)) return true;
  }
  for (const RequestStepPlan& row : plan.rows) {
    if (row.newly_admitted && pending(*row.request)) return true;
  }
  return false;
}

void DynamicBatchScheduler::ScheduleDrafts(Budget& budget, StepPlan& plan) const {
  if (limits_.max_draft_tokens == 0) return;
  const size_t block_size = cache_.block_size();
  for (RequestStepPlan& row : plan.rows) {
    const Request& request = *row.request;
    if (row.prefill || request.draft_tokens.empty() || budget.tokens >= limits_.max_scheduled_tokens) continue;
    size_t drafts = std::min(request.draft_tokens.size(), limits_.max_draft_tokens);
    if (limits_.max_query_tokens > 0) drafts = std::min(drafts, limits_.max_query_tokens - row.token_count);
    drafts = std::min(drafts, limits_.max_scheduled_tokens - budget.tokens);
    // Tokens past the session or the turn's cap would be discarded: do not verify them.
    const size_t length = request.tokens.size();  // the pending token included
    drafts = std::min(drafts, request.max_session_tokens > length + 1 ? request.max_session_tokens - length - 1 : 0);
    if (request.policy.max_generated_tokens != 0) {
      const uint64_t left = request.policy.max_generated_tokens - request.turn_generated_tokens;
      drafts = std::min<size_t>(drafts, left > 0 ? static_cast<size_t>(left - 1) : 0);
    }
    // Blocks: what the row already covers, plus free blocks, within the block-table width.
    const size_t columns = std::min(limits_.max_block_table_columns, row.blocks_after + budget.free_blocks);
    const size_t coverable = columns * block_size;
    const size_t base = row.reserve_slots;  // processed + 1
    drafts = std::min(drafts, coverable > base ? coverable - base : 0);
    if (drafts == 0) continue;
    const size_t blocks_after = std::max(row.blocks_after, cache_.BlocksFor(base + drafts));
    const size_t extra_blocks = blocks_after - row.blocks_after;
    row.draft_count = drafts;
    row.reserve_slots = base + drafts;
    row.new_blocks += extra_blocks;
    row.blocks_after = blocks_after;
    plan.new_blocks += extra_blocks;
    budget.free_blocks -= extra_blocks;
    budget.tokens += drafts;
  }
}

void DynamicBatchScheduler::ExpandPrefills(StepPlan& plan) const {
  size_t spare = limits_.max_scheduled_tokens;
  for (const RequestStepPlan& row : plan.rows) spare -= row.packed_tokens();
  for (RequestStepPlan& row : plan.rows) {
    if (spare == 0) break;
    if (!row.prefill) continue;
    size_t cap = row.remaining();
    const int64_t chunk_size = row.request->search.chunk_size;
    if (chunk_size > 0) cap = std::min(cap, static_cast<size_t>(chunk_size));
    // A ring's chunk is a physical limit: a larger request chunk is capped to it.
    if (limits_.max_query_tokens > 0) cap = std::min(cap, limits_.max_query_tokens);
    const size_t extra = std::min(cap - row.token_count, spare);
    row.token_count += extra;
    spare -= extra;
  }
}

void DynamicBatchScheduler::OrderByFixedSlot(StepPlan& plan) const {
  plan.publish_order.resize(plan.rows.size());  // capacity max_batch_size: no allocation
  for (size_t r = 0; r < plan.rows.size(); ++r) plan.rows[r].rank = r;
  if (limits_.fixed_state_row_bytes > 0) {
    bool admissions = false;
    for (const RequestStepPlan& row : plan.rows) admissions = admissions || row.newly_admitted;
    if (!admissions) {
      // Insertion sort: stable, allocation-free, and residents are mostly in slot order already.
      for (size_t i = 1; i < plan.rows.size(); ++i) {
        for (size_t j = i; j > 0 && plan.rows[j - 1].request->fixed_slot > plan.rows[j].request->fixed_slot; --j) {
          std::swap(plan.rows[j - 1], plan.rows[j]);
        }
      }
    }
    plan.fixed_state.required = true;
    plan.fixed_state.rows = plan.rows.size();
    for (const RequestStepPlan& row : plan.rows) plan.fixed_state.new_slots += row.newly_admitted ? 1 : 0;
    plan.fixed_state.binding_bytes = plan.rows.size() * limits_.fixed_state_row_bytes * 2;
  }
  for (size_t r = 0; r < plan.rows.size(); ++r) plan.publish_order[plan.rows[r].rank] = r;
}

void DynamicBatchScheduler::AssignPackedLayout(StepPlan& plan) const {
  size_t offset = 0;
  bool graph_eligible = true;
  for (RequestStepPlan& row : plan.rows) {
    row.packed_offset = offset;
    row.logits_index = offset + row.token_count - 1;
    offset += row.packed_tokens();
    row.samples = row.token_count == row.remaining();
    plan.block_table_columns = std::max(plan.block_table_columns, row.blocks_after);
    graph_eligible = graph_eligible && !row.prefill && row.packed_tokens() == 1;
  }
  plan.num_tokens = offset;
  plan.graph_eligible = graph_eligible;
}

void DynamicBatchScheduler::CommitAdmissions(const StepPlan& plan) {
  bool admitted = false;
  for (const RequestStepPlan& row : plan.rows) {
    if (!row.newly_admitted) continue;
    residents_.push_back(row.request);  // capacity max_batch_size: planning bounded admissions
    row.request->waiting = false;
    admitted = true;
  }
  if (admitted) {
    waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), [](const Request* r) { return !r->waiting; }),
                   waiting_.end());
  }
}

}  // namespace oga
