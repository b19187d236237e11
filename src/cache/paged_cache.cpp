#include "cache/paged_cache.h"

#include <algorithm>
#include <string>

#include "base/errors.h"
#include "request/request.h"

namespace oga {

PagedKeyValueCache::PagedKeyValueCache(size_t block_size, size_t num_blocks, size_t max_residents, size_t max_columns,
                                       bool prefix_caching)
    : block_size_(block_size),
      max_columns_(max_columns),
      pool_(num_blocks),
      tables_(max_residents),
      reservation_(num_blocks, max_residents),
      refs_(num_blocks, 0),
      prefix_(prefix_caching ? std::make_unique<PrefixCache>(num_blocks, block_size) : nullptr) {
  for (BlockTable& table : tables_) table.blocks.reserve(max_columns);
  free_tables_.reserve(max_residents);
  for (size_t i = max_residents; i > 0; --i) free_tables_.push_back(static_cast<int32_t>(i - 1));
}

size_t PagedKeyValueCache::OwnedBlocks(const Request& request) const {
  return request.cache_slot < 0 ? 0 : tables_[static_cast<size_t>(request.cache_slot)].blocks.size();
}

const BlockTable* PagedKeyValueCache::TableOf(const Request& request) const {
  return request.cache_slot < 0 ? nullptr : &tables_[static_cast<size_t>(request.cache_slot)];
}

void PagedKeyValueCache::Reserve(const StepPlan& plan) {
  if (reservation_.live()) throw ContractError("a paged-cache reservation is already live");
  // Adoptions first, so that taking new blocks cannot evict a block this step adopts.
  for (const RequestStepPlan& row : plan.rows) {
    for (size_t i = 0; i < row.cached_blocks; ++i) Adopt(plan.cached_block_ids[row.cached_begin + i]);
  }
  if (plan.new_blocks > free_blocks()) {
    const size_t available = free_blocks();
    for (size_t r = plan.rows.size(); r > 0; --r) {
      const RequestStepPlan& row = plan.rows[r - 1];
      for (size_t i = row.cached_blocks; i > 0; --i) Unref(plan.cached_block_ids[row.cached_begin + i - 1]);
    }
    throw ContractError("the step plan needs " + std::to_string(plan.new_blocks) + " blocks but only " +
                        std::to_string(available) + " are free");
  }
  reservation_.Begin();
  size_t admissions = 0;
  for (const RequestStepPlan& row : plan.rows) {
    // Commit hands admissions the free tables from the back of the stack, in row order.
    int32_t slot = row.request->cache_slot;
    if (slot < 0 && admissions < free_tables_.size()) slot = free_tables_[free_tables_.size() - 1 - admissions++];
    reservation_.BeginRow(slot);
    for (size_t i = 0; i < row.cached_blocks; ++i) reservation_.Add(plan.cached_block_ids[row.cached_begin + i]);
    for (size_t i = 0; i < row.new_blocks; ++i) reservation_.Add(TakeBlock());
  }
  reservation_.Finish();
  if (fixed_) {
    try {
      fixed_->Reserve(plan);
    } catch (...) {
      Discard();
      throw;
    }
  }
}

int32_t PagedKeyValueCache::TakeBlock() {
  int32_t block;
  if (pool_.free_count() > 0) {
    block = pool_.Take();
  } else {
    block = prefix_ ? prefix_->EvictOldest() : -1;
    if (block < 0) throw ContractError("the block pool ran out during a reservation");
    if (fixed_) fixed_->DropCheckpoint(block);
  }
  refs_[static_cast<size_t>(block)] = 1;
  return block;
}

void PagedKeyValueCache::Unref(int32_t block) {
  int32_t& refs = refs_[static_cast<size_t>(block)];
  if (--refs > 0) return;
  if (prefix_ && prefix_->indexed(block)) {
    prefix_->MakeEvictable(block);
  } else {
    if (fixed_) fixed_->DropCheckpoint(block);
    pool_.Give(block);
  }
}

void PagedKeyValueCache::Adopt(int32_t block) {
  if (refs_[static_cast<size_t>(block)]++ == 0 && prefix_) prefix_->Unevict(block);
}

void PagedKeyValueCache::WriteBlockTable(const StepPlan& plan, int32_t* out, size_t columns) const {
  for (size_t r = 0; r < plan.rows.size(); ++r) {
    int32_t* row_out = out + r * columns;
    size_t column = 0;
    if (const BlockTable* table = TableOf(*plan.rows[r].request)) {
      for (int32_t block : table->blocks) row_out[column++] = block;
    }
    for (size_t i = reservation_.row_begin(r); i < reservation_.row_end(r); ++i) {
      row_out[column++] = reservation_.blocks()[i];
    }
    std::fill(row_out + column, row_out + columns, -1);
  }
}

int32_t PagedKeyValueCache::TableSlot(size_t row) const { return reservation_.table_slot(row); }

void PagedKeyValueCache::ValidateCommit(const StepPlan& plan) const {
  if (!reservation_.live()) throw ContractError("commit without a live paged-cache reservation");
  if (reservation_.rows() != plan.rows.size()) {
    throw ContractError("the paged-cache reservation does not match the step plan's rows");
  }
  size_t new_tables = 0;
  for (size_t r = 0; r < plan.rows.size(); ++r) {
    const RequestStepPlan& row = plan.rows[r];
    const Request& request = *row.request;
    const size_t reserved = reservation_.row_blocks(r);
    if (reserved != row.cached_blocks + row.new_blocks) {
      throw ContractError("reserved blocks differ from the planned blocks");
    }
    const BlockTable* table = TableOf(request);
    if (row.newly_admitted != (table == nullptr)) {
      throw ContractError("a planned admission does not match cache residency");
    }
    if (table == nullptr) {
      ++new_tables;
    } else if (table->owner != &request || table->committed_slots != row.processed_before || row.cached_blocks != 0) {
      throw ContractError("a resident block table changed since planning");
    }
    const size_t blocks_after = (table ? table->blocks.size() : 0) + reserved;
    const size_t committed_after = row.processed_before + row.committed_tokens();
    if (blocks_after != row.blocks_after || blocks_after > max_columns_ ||
        KeptBlocks(row, table ? table->blocks.size() : 0) * block_size_ < committed_after ||
        row.accepted_drafts > row.draft_count) {
      throw ContractError("a block table cannot hold its committed slots after the step");
    }
  }
  if (new_tables > free_tables_.size()) throw ContractError("more admissions than free block tables");
  if (fixed_) fixed_->ValidateCommit(plan);
}

int32_t PagedKeyValueCache::ReservedTableBlock(const StepPlan& plan, size_t row, size_t index) const {
  const BlockTable* table = TableOf(*plan.rows[row].request);
  const size_t owned = table ? table->blocks.size() : 0;
  if (index < owned) return table->blocks[index];
  const size_t at = reservation_.row_begin(row) + (index - owned);
  return at < reservation_.row_end(row) ? reservation_.blocks()[at] : -1;
}

void PagedKeyValueCache::PrepareCommit(const StepPlan& plan) {
  if (!fixed_) return;
  checkpoint_requests_.clear();
  if (prefix_ && fixed_->checkpoints_enabled()) {
    // A prefill step that ends exactly on a block boundary leaves a state later prompts sharing
    // that prefix can start from.
    for (size_t r = 0; r < plan.rows.size(); ++r) {
      const RequestStepPlan& row = plan.rows[r];
      const size_t boundary = row.processed_before + row.committed_tokens();
      if (!row.prefill || boundary == 0 || boundary % block_size_ != 0) continue;
      const int32_t block = ReservedTableBlock(plan, r, boundary / block_size_ - 1);
      if (block < 0) continue;
      // The least recently used checkpoint of a shorter prefix of the same tokens (walked through
      // the index, so a recomputed duplicate finds its indexed twin's).
      int32_t ancestor = -1;
      int32_t parent = -1;
      for (size_t i = 0; i + 1 < boundary / block_size_; ++i) {
        parent = prefix_->Find(parent, row.request->tokens.data() + i * block_size_);
        if (parent < 0) break;
        const int32_t checkpoint = fixed_->checkpoint_of(parent);
        if (checkpoint >= 0 &&
            (ancestor < 0 || fixed_->checkpoint_last_use(checkpoint) < fixed_->checkpoint_last_use(ancestor))) {
          ancestor = checkpoint;
        }
      }
      checkpoint_requests_.push_back({r, block, ancestor});
    }
  }
  fixed_->PrepareCommit(plan, checkpoint_requests_);
}

size_t PagedKeyValueCache::KeptBlocks(const RequestStepPlan& row, size_t owned) const {
  if (row.draft_count == 0) return row.blocks_after;  // prefills keep their whole-prompt reservation
  return std::max(owned, BlocksFor(row.processed_before + row.committed_tokens()));
}

void PagedKeyValueCache::Commit(const StepPlan& plan) {
  for (size_t r = 0; r < plan.rows.size(); ++r) {
    const RequestStepPlan& row = plan.rows[r];
    Request& request = *row.request;
    if (request.cache_slot < 0) {
      request.cache_slot = free_tables_.back();  // == reservation_.table_slot(r)
      free_tables_.pop_back();
      BlockTable& table = tables_[static_cast<size_t>(request.cache_slot)];
      table.owner = &request;
      table.committed_slots = 0;
      table.blocks.clear();
    }
    BlockTable& table = tables_[static_cast<size_t>(request.cache_slot)];
    // A verified row keeps blocks for the accepted prefix only; the rest go back to the pool.
    const size_t keep = KeptBlocks(row, table.blocks.size());
    for (size_t i = reservation_.row_begin(r); i < reservation_.row_end(r); ++i) {
      const int32_t block = reservation_.blocks()[i];
      if (table.blocks.size() < keep) {
        table.blocks.push_back(block);  // the reservation's reference moves to the table
      } else {
        Unref(block);
      }
    }
    table.committed_slots = row.processed_before + row.committed_tokens();
  }
  reservation_.Clear();
  if (fixed_ && !fixed_->PublishCommit(plan)) {
    throw ContractError("the fixed-state reservation was not prepared for the published step");
  }
}

void PagedKeyValueCache::Discard() {
  if (fixed_) fixed_->Discard();
  if (!reservation_.live()) return;
  const std::vector<int32_t>& blocks = reservation_.blocks();
  for (size_t i = blocks.size(); i > 0; --i) Unref(blocks[i - 1]);
  reservation_.Clear();
}

void PagedKeyValueCache::Release(Request& request) {
  if (fixed_) fixed_->Release(request);
  if (request.cache_slot < 0) return;
  BlockTable& table = tables_[static_cast<size_t>(request.cache_slot)];
  for (size_t i = table.blocks.size(); i > 0; --i) Unref(table.blocks[i - 1]);
  table.blocks.clear();
  table.committed_slots = 0;
  table.owner = nullptr;
  free_tables_.push_back(request.cache_slot);
  request.cache_slot = -1;
}

void PagedKeyValueCache::IndexCommitted(const StepPlan& plan) {
  if (!prefix_) return;
  for (const RequestStepPlan& row : plan.rows) {
    const Request& request = *row.request;
    if (request.cache_slot < 0) continue;
    const BlockTable& table = tables_[static_cast<size_t>(request.cache_slot)];
    const size_t full = std::min(table.committed_slots, request.tokens.size()) / block_size_;
    const size_t first = row.processed_before / block_size_;
    if (first >= full || first >= table.blocks.size()) continue;
    int32_t parent = first > 0 ? table.blocks[first - 1] : -1;
    if (fixed_ && parent >= 0 && !prefix_->indexed(parent)) {
      // Hybrid models recompute indexed blocks whenever no fixed-state checkpoint lets them adopt:
      // the new blocks then continue the indexed twin's chain (as 0.18 indexes them) -- unless part
      // of that chain was evicted meanwhile, when they stay private (a root here would index
      // mid-prompt tokens as a prompt's start).
      parent = -1;
      for (size_t i = 0; i < first; ++i) {
        parent = prefix_->Find(parent, request.tokens.data() + i * block_size_);
        if (parent < 0) break;
      }
      if (parent < 0) continue;
    }
    for (size_t i = first; i < full && i < table.blocks.size(); ++i) {
      // A duplicate of an indexed block (the same prompt admitted twice at once) stays private.
      prefix_->Register(table.blocks[i], parent, request.tokens.data() + i * block_size_);
      if (prefix_->indexed(table.blocks[i])) {
        parent = table.blocks[i];
      } else if (fixed_ && parent >= -1) {
        parent = prefix_->Find(parent, request.tokens.data() + i * block_size_);  // its indexed twin
        if (parent < 0) break;
      } else {
        parent = table.blocks[i];  // paged models: the chain stops at a duplicate
      }
    }
  }
  if (fixed_ && !checkpoint_requests_.empty()) {
    // A checkpoint belongs to the indexed block its prefix resolves to: the row's own block, or the
    // indexed twin of a block it computed again (a duplicate stays private).
    for (const FixedStatePool::CheckpointRequest& checkpoint : checkpoint_requests_) {
      const Request& request = *plan.rows[checkpoint.row].request;
      const RequestStepPlan& row = plan.rows[checkpoint.row];
      const size_t blocks = (row.processed_before + row.committed_tokens()) / block_size_;
      int32_t block = -1;
      for (size_t i = 0; i < blocks; ++i) {
        block = prefix_->Find(block, request.tokens.data() + i * block_size_);
        if (block < 0) break;
      }
      fixed_->PublishCheckpoint(checkpoint.block, block);
    }
    checkpoint_requests_.clear();
  }
  if (fixed_) fixed_->EndCheckpointPublication();
}

}  // namespace oga
