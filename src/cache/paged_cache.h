// Paged KV-cache ownership: per-request block tables over one BlockPool, and the all-or-nothing
// reservation a step holds while the model runs.
//
// A block is free, reserved by the live step, or committed to a request's table. The model sees
// committed + reserved blocks through the combined block table; only Commit publishes them.
// Admission reserves blocks for a request's whole unprocessed prompt, while committed slots advance
// only by the tokens a step actually executed.
//
// With prefix caching, full committed blocks are indexed by content (PrefixCache) and shared:
// blocks are reference counted (tables and the live reservation), a newly admitted request adopts
// the indexed blocks its prompt starts with as part of its reservation, and an indexed block that
// nobody references stays adoptable (evictable) until the pool needs it. Shared blocks are always
// full, so no step ever writes into a block another table holds.
//
// Hybrid models (fixed_conv / fixed_recurrent state groups): the cache also owns the FixedStatePool
// and every transaction covers both -- Reserve reserves blocks and fixed slots for the same rows,
// PrepareCommit does the fixed state's fallible copies, Commit publishes paged occupancy and then
// flips the fixed banks, Discard and Release drop both -- so that paged and fixed state always
// name the same requests at the same token boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cache/block_pool.h"
#include "cache/fixed_state_pool.h"
#include "cache/paged_cache_reservation.h"
#include "cache/prefix_cache.h"
#include "plan/step_plan.h"

namespace oga {

class Request;

struct BlockTable {
  Request* owner = nullptr;  // nullptr = table slot unused
  size_t committed_slots = 0;
  std::vector<int32_t> blocks;  // logical order; capacity reserved at construction
};

class PagedKeyValueCache {
 public:
  PagedKeyValueCache(size_t block_size, size_t num_blocks, size_t max_residents, size_t max_columns,
                     bool prefix_caching = false);

  size_t block_size() const { return block_size_; }
  size_t total_blocks() const { return pool_.total(); }
  // Blocks a reservation can take: free ones, and indexed ones nobody references (evicted on take).
  size_t free_blocks() const { return pool_.free_count() + (prefix_ ? prefix_->evictable_count() : 0); }
  bool prefix_caching() const { return prefix_ != nullptr; }
  // The indexed block holding the block_size tokens at `tokens` after `parent` (-1 first), or -1.
  int32_t FindCached(int32_t parent, const int32_t* tokens) const {
    return prefix_ ? prefix_->Find(parent, tokens) : -1;
  }
  bool evictable(int32_t block) const { return prefix_ && prefix_->evictable(block); }
  size_t max_columns() const { return max_columns_; }
  size_t BlocksFor(size_t slots) const { return (slots + block_size_ - 1) / block_size_; }
  size_t OwnedBlocks(const Request& request) const;
  const BlockTable* TableOf(const Request& request) const;

  // Hybrid models: the fixed-state pool joins every transaction from now on.
  void EnableFixedState(std::unique_ptr<FixedStatePool> pool) {
    fixed_ = std::move(pool);
    checkpoint_requests_.reserve(tables_.size());
  }
  // Hybrid models with prefix caching: adopting cached blocks up to `block` needs its checkpoint.
  bool AdoptableWithFixedState(int32_t block) const { return fixed_ == nullptr || fixed_->HasCheckpoint(block); }
  FixedStatePool* fixed_state() { return fixed_.get(); }
  const FixedStatePool* fixed_state() const { return fixed_.get(); }

  // Reserves every block (and fixed-state slot) the plan's rows need. Throws ContractError (and
  // reserves nothing) when the pool cannot cover the plan, which planning promised it could.
  void Reserve(const StepPlan& plan);
  bool reservation_live() const { return reservation_.live(); }
  // Writes the combined (committed + reserved) table of every plan row, -1 padded to `columns`.
  void WriteBlockTable(const StepPlan& plan, int32_t* out, size_t columns) const;
  // The block table a plan row has (or gets at commit, for an admission) during the live
  // reservation: it also names the row's sliding-window ring blocks.
  int32_t TableSlot(size_t row) const;
  // Checks every precondition of Commit without changing anything; throws ContractError.
  void ValidateCommit(const StepPlan& plan) const;
  // The transaction's last fallible work: the fixed state's copies into inactive banks (nothing
  // for a paged-only model). A failure is fatal for the engine.
  void PrepareCommit(const StepPlan& plan);
  // Publishes the reservation: reserved blocks join their tables, committed slots advance, new
  // requests get a table; then the fixed banks flip. Call only after PrepareCommit; performs no
  // allocation.
  void Commit(const StepPlan& plan);
  // Returns the reservation's blocks (and provisional fixed slots) to the pool, restoring its exact
  // previous state.
  void Discard();
  // Releases everything `request` owns (close, abandonment, unserviceable).
  void Release(Request& request);
  // Indexes the blocks the plan's rows filled (prefix caching; after the requests' tokens were
  // published, so the blocks' tokens can be read from them).
  void IndexCommitted(const StepPlan& plan);

  // For the invariant checker.
  const BlockPool& pool() const { return pool_; }
  const PrefixCache* prefix() const { return prefix_.get(); }
  int32_t references(int32_t block) const { return refs_[static_cast<size_t>(block)]; }
  const std::vector<BlockTable>& tables() const { return tables_; }
  const std::vector<int32_t>& reserved_blocks() const { return reservation_.blocks(); }

 private:
  // Blocks `row`'s table keeps at commit (owning `owned` before the step).
  size_t KeptBlocks(const RequestStepPlan& row, size_t owned) const;
  // A block for the reservation: a free one, else the least recently released indexed one.
  int32_t TakeBlock();
  // The block at logical index `index` of plan row `row`'s table during the live reservation.
  int32_t ReservedTableBlock(const StepPlan& plan, size_t row, size_t index) const;
  // One reference fewer; an unreferenced block becomes evictable if indexed, else free.
  void Unref(int32_t block);
  // One reference more to an indexed block (no longer evictable).
  void Adopt(int32_t block);

  size_t block_size_;
  size_t max_columns_;
  BlockPool pool_;
  std::vector<BlockTable> tables_;
  std::vector<int32_t> free_tables_;
  PagedCacheReservation reservation_;  // the live step's blocks (it holds one reference on each)
  std::vector<int32_t> refs_;          // per block: tables and reservation entries holding it
  std::unique_ptr<PrefixCache> prefix_;  // null without prefix caching
  std::unique_ptr<FixedStatePool> fixed_;  // null without fixed state
  std::vector<FixedStatePool::CheckpointRequest> checkpoint_requests_;  // per step, capacity max rows
};

}  // namespace oga
