// Paged KV-cache ownership: per-request block tables over one BlockPool, and the all-or-nothing
// reservation a step holds while the model runs.
//
// A block is free, reserved by the live step, or committed to exactly one request's table. The model
// sees committed + reserved blocks through the combined block table; only Commit publishes them.
// Admission reserves blocks for a request's whole unprocessed prompt, while committed slots advance
// only by the tokens a step actually executed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "block_pool.h"
#include "step_plan.h"

namespace oga {

class Request;

struct BlockTable {
  Request* owner = nullptr;  // nullptr = table slot unused
  size_t committed_slots = 0;
  std::vector<int32_t> blocks;  // logical order; capacity reserved at construction
};

class PagedKeyValueCache {
 public:
  PagedKeyValueCache(size_t block_size, size_t num_blocks, size_t max_residents, size_t max_columns);

  size_t block_size() const { return block_size_; }
  size_t total_blocks() const { return pool_.total(); }
  size_t free_blocks() const { return pool_.free_count(); }
  size_t max_columns() const { return max_columns_; }
  size_t BlocksFor(size_t slots) const { return (slots + block_size_ - 1) / block_size_; }
  size_t OwnedBlocks(const Request& request) const;
  const BlockTable* TableOf(const Request& request) const;

  // Reserves every block the plan's rows need. Throws ContractError (and reserves nothing) when the
  // pool cannot cover the plan, which planning promised it could.
  void Reserve(const StepPlan& plan);
  bool reservation_live() const { return reservation_live_; }
  // Writes the combined (committed + reserved) table of every plan row, -1 padded to `columns`.
  void WriteBlockTable(const StepPlan& plan, int32_t* out, size_t columns) const;
  // Checks every precondition of Commit without changing anything; throws ContractError.
  void ValidateCommit(const StepPlan& plan) const;
  // Publishes the reservation: reserved blocks join their tables, committed slots advance, new
  // requests get a table. Call only after ValidateCommit; performs no allocation.
  void Commit(const StepPlan& plan);
  // Returns the reservation's blocks to the pool, restoring its exact previous state.
  void Discard();
  // Releases everything `request` owns (close, abandonment, unserviceable).
  void Release(Request& request);
  // Keeps the first `slots` committed slots of `request` and returns the blocks past them (rewind).
  // Only between steps.
  void Truncate(Request& request, size_t slots);

  // For the invariant checker.
  const BlockPool& pool() const { return pool_; }
  const std::vector<BlockTable>& tables() const { return tables_; }
  const std::vector<int32_t>& reserved_blocks() const { return reserved_; }

 private:
  // Blocks `row`'s table keeps at commit (owning `owned` before the step).
  size_t KeptBlocks(const RequestStepPlan& row, size_t owned) const;

  size_t block_size_;
  size_t max_columns_;
  BlockPool pool_;
  std::vector<BlockTable> tables_;
  std::vector<int32_t> free_tables_;
  std::vector<int32_t> reserved_;      // blocks of the live reservation, in take order
  std::vector<size_t> reserved_begin_; // per plan row: first index into reserved_
  bool reservation_live_ = false;
};

}  // namespace oga
