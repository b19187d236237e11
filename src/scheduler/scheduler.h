// DynamicBatchScheduler: builds each step's plan for continuous batching.
//
// Scheduling model: decode first. Every step starts from the requests that can make progress now:
// resident decodes (in resident order), then resident prefills (queued continuations and prompts
// whose prefill was chunked), then waiting requests (submission order). Each candidate first asks for
// one provisional token, so cache feasibility is decided before a long prompt spends the token budget;
// a candidate that does not fit is skipped and later ones are still considered. Selected prefills then
// grow, in order, up to their remaining prompt, search.chunk_size and max_scheduled_tokens. A new
// prompt is admitted only when blocks for its whole prompt fit and the committed residents plus the
// step's admissions stay within max_batch_size. With prefix caching, a new prompt whose next block
// another request is still prefilling waits for that block to be indexed rather than compute it
// again. Caller-supplied drafts are optional work: they get
// what budget is left after every mandatory token, before prefills grow. Sustained decode demand
// can starve prefills.
//
// Preemption by recompute: when a resident (a decode, or a continuation's prefill) cannot get its
// blocks, or nothing fits at all, the engine asks PreemptionVictim for a resident to give its cache
// back -- the most recently admitted running request other than the oldest one (possibly the
// starved one itself), then turn-complete residents in admission order -- and plans again, until
// every resident is scheduled. A running victim is requeued at the front of the waiting queue and
// admitted again later like a prompt of all its committed tokens. Admission is then first come,
// first served (a waiting prompt that does not fit blocks the ones behind it), a step that
// preempted a running request admits nothing, and a new prompt is admitted only with one free
// block left per running request. The oldest running request is never a victim, so it always
// progresses, and no arrival stream can overtake a waiting one: every request whose session fits
// the pool alone finishes.
#pragma once

#include <cstddef>
#include <vector>

#include "cache/paged_cache.h"
#include "plan/step_plan.h"

namespace oga {

class Request;

struct SchedulerLimits {
  size_t max_batch_size = 0;        // rows per step and committed residents
  size_t max_scheduled_tokens = 0;  // packed tokens per step
  size_t max_block_table_columns = 0;
  size_t max_draft_tokens = 0;      // per proposal; 0 = the executor cannot verify drafts
  size_t max_query_tokens = 0;      // per row and step (the sliding-window ring's chunk C); 0 = none
  // Engine-wide cache configuration the scheduler's collaborators are built with.
  bool prefix_caching = false;
  size_t window_ring_blocks = 0;    // R per block table; 0 = no sliding-window ring
  size_t fixed_state_row_bytes = 0; // one request's fixed state over every tensor; 0 = no fixed state
  bool graph_capture = false;       // pure-decode steps are packed for CUDA graphs
  bool preemption = true;           // recompute preemption when nothing fits (else CapacityBlocked)
};

class DynamicBatchScheduler {
 public:
  DynamicBatchScheduler(const SchedulerLimits& limits, PagedKeyValueCache& cache);

  // Makes the next Enqueue allocation-free, so BeginTurn can fail before it mutates anything.
  void ReserveWaitingSlot() {
    if (waiting_.size() == waiting_.capacity()) waiting_.reserve(waiting_.empty() ? 16 : waiting_.size() * 2);
  }
  // Queues a nonresident request (first turn, or a turn cancelled before admission).
  void Enqueue(Request& request);
  // Queues a preempted request ahead of every waiting one (call ReserveWaitingSlot first).
  void EnqueueFront(Request& request);
  // Removes a request from the waiting queue or the residents (it must not be reserved).
  void Remove(Request& request);
  // The resident to preempt when nothing fits, or nullptr when preempting cannot help.
  Request* PreemptionVictim() const;
  // Plans the next step without mutating any request or cache state; `admit` false considers no
  // waiting request (a step that preempted a running request admits nothing).
  void PlanStep(StepPlan& plan, bool admit = true) const;
  // Publishes the admissions of a committed plan (after the cache committed it).
  void CommitAdmissions(const StepPlan& plan);

  // Whether a step would find a schedulable request (Request::schedulable).
  bool HasExecutableWork() const;
  const std::vector<Request*>& waiting() const { return waiting_; }
  const std::vector<Request*>& residents() const { return residents_; }
  const SchedulerLimits& limits() const { return limits_; }

 private:
  struct Budget;
  bool HasSchedulableWaiting() const;
  // Returns false when no later candidate can be selected either.
  bool Consider(Request& request, bool newly_admitted, bool prefill, Budget& budget, StepPlan& plan) const;
  // Gives decode rows with a pending proposal as many of its drafts as the token budget, the free
  // blocks, the block-table width and the turn's own limits allow (never at another row's expense:
  // every selected row already holds its mandatory token and blocks).
  void ScheduleDrafts(Budget& budget, StepPlan& plan) const;
  void ExpandPrefills(StepPlan& plan) const;
  // Prefix caching: whether a request still prefilling will index the block after this prompt's
  // `cached_blocks` adoptable ones (so admitting it now would compute that block twice).
  bool SharesPendingPrefix(const Request& request, size_t cached_blocks, size_t limit_blocks,
                           const StepPlan& plan) const;
  // Hybrid models: an all-resident step executes in fixed-slot order, so that a contiguous slot
  // interval can be bound directly; events keep the scheduler order (RequestStepPlan::rank).
  void OrderByFixedSlot(StepPlan& plan) const;
  void AssignPackedLayout(StepPlan& plan) const;

  SchedulerLimits limits_;
  PagedKeyValueCache& cache_;
  std::vector<Request*> waiting_;    // submission order
  std::vector<Request*> residents_;  // admission order
};

}  // namespace oga
