// The plan of one dynamic step: which requests run, how many tokens each contributes, and where
// they sit in the packed input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oga {

class Request;

enum class StepOutcome {
  NoWork,                // nothing executable
  CapacityDeferred,      // work exists, none of it fits free capacity now
  UnserviceableRequest,  // some request can never fit; its turn fails
  Executable,            // rows selected; expected to commit
};

struct RequestStepPlan {
  Request* request = nullptr;
  size_t processed_before = 0;  // committed KV length = first write position
  size_t token_count = 0;       // unprocessed tokens this step (authoritative)
  size_t draft_count = 0;       // caller-supplied draft tokens verified after them (decode rows only)
  size_t cached_blocks = 0;     // prefix-cache blocks a newly admitted request adopts (before processed_before)
  size_t cached_begin = 0;      // their first index into StepPlan::cached_block_ids
  size_t remaining_tokens = 0;  // the request's tokens not in its KV before the step (adopted ones count as in)
  size_t accepted_drafts = 0;   // staged by verification: drafts the commit keeps
  size_t reserve_slots = 0;     // cache slots the request's blocks must cover after this step
  size_t blocks_after = 0;      // blocks the request owns once this step commits
  size_t new_blocks = 0;        // blocks this step reserves for it
  bool prefill = false;
  bool newly_admitted = false;
  bool samples = false;         // the step consumes every unprocessed token, so a token is sampled
  size_t rank = 0;              // scheduler order (events); rows may execute in fixed-slot order
  size_t packed_offset = 0;     // first row in the packed input
  size_t logits_index = 0;      // packed row of its last unprocessed token (drafts' rows follow)

  size_t packed_tokens() const { return token_count + draft_count; }
  size_t remaining() const { return remaining_tokens; }
  // Slots the commit adds to the request's KV: its tokens plus the accepted drafts.
  size_t committed_tokens() const { return token_count + accepted_drafts; }
};

// The fixed-state resources a plan needs (hybrid models); the engine proves the reservation matches.
struct FixedStatePlan {
  bool required = false;
  size_t rows = 0;
  size_t new_slots = 0;
  size_t binding_bytes = 0;  // input and output rows over every fixed tensor
};

struct StepPlan {
  StepOutcome outcome = StepOutcome::NoWork;
  std::vector<RequestStepPlan> rows;    // execution order: scheduler order (decodes, then prefills),
                                        // or fixed-slot order for an all-resident hybrid step
  std::vector<size_t> publish_order;    // row indices in scheduler order (rank)
  FixedStatePlan fixed_state;
  std::vector<Request*> unserviceable;  // turns that can never fit
  std::vector<int32_t> cached_block_ids;  // prefix-cache blocks adopted by the rows, row after row
  size_t num_tokens = 0;
  size_t block_table_columns = 0;
  size_t new_blocks = 0;
  bool capacity_deferred = false;  // some candidate waited for capacity
  size_t deferred_residents = 0;   // residents (decodes, continuations) that waited for blocks: preemption's trigger
  bool graph_eligible = false;     // pure decode, one token per row

  void Reset() {
    outcome = StepOutcome::NoWork;
    rows.clear();
    publish_order.clear();
    fixed_state = FixedStatePlan{};
    unserviceable.clear();
    cached_block_ids.clear();
    num_tokens = 0;
    block_table_columns = 0;
    new_blocks = 0;
    capacity_deferred = false;
    deferred_residents = 0;
    graph_eligible = false;
  }
};

}  // namespace oga
