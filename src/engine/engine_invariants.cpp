// Engine::CheckInvariants: proves that scheduler, paged cache, requests and the event queue agree.
// Tests call it after every Run. Cost is linear in blocks, residents and bound requests.
#include <sstream>
#include <vector>

#include "engine/engine.h"

namespace oga {
namespace {

const char* StatusName(RequestStatus status) {
  switch (status) {
    case RequestStatus::Unassigned: return "Unassigned";
    case RequestStatus::Assigned: return "Assigned";
    case RequestStatus::Active: return "Active";
    case RequestStatus::TurnComplete: return "TurnComplete";
    case RequestStatus::Closed: return "Closed";
  }
  return "?";
}

// The checks report each violation through this.
class Violations {
 public:
  void operator()(const std::string& text) { text_ << text << "\n"; }
  std::string str() const { return text_.str(); }

 private:
  std::ostringstream text_;
};

bool InRange(int32_t block, size_t total, const char* where, Violations& report) {
  if (block >= 0 && static_cast<size_t>(block) < total) return true;
  report(std::string("block id ") + std::to_string(block) + " out of range in " + where);
  return false;
}

// Each request block table against its request; counts the table entries holding each block into
// `holders`. Returns the tables in use.
size_t CheckBlockTables(const PagedKeyValueCache& cache, std::vector<int>& holders, Violations& report) {
  const size_t total = cache.total_blocks();
  const size_t block_size = cache.block_size();
  size_t tables_in_use = 0;
  for (size_t slot = 0; slot < cache.tables().size(); ++slot) {
    const BlockTable& table = cache.tables()[slot];
    if (table.owner == nullptr) {
      if (!table.blocks.empty()) report("unused block table " + std::to_string(slot) + " holds blocks");
      continue;
    }
    ++tables_in_use;
    for (size_t i = 0; i < table.blocks.size(); ++i) {
      const int32_t block = table.blocks[i];
      if (!InRange(block, total, "a request block table", report)) continue;
      ++holders[static_cast<size_t>(block)];
      for (size_t k = 0; k < i; ++k) {
        if (table.blocks[k] == block) report("block " + std::to_string(block) + " appears twice in one table");
      }
      // A block another table holds is never written again: it must be full here.
      if (cache.references(block) > 1 && (i + 1) * block_size > table.committed_slots) {
        report("shared block " + std::to_string(block) + " is not full in the table of request " +
               std::to_string(table.owner->serial));
      }
    }
    const Request& request = *table.owner;
    if (request.cache_slot != static_cast<int32_t>(slot)) {
      report("block table " + std::to_string(slot) + " names request " + std::to_string(request.serial) +
             " which does not point back to it");
    }
    if (table.committed_slots != request.processed) {
      report("request " + std::to_string(request.serial) + ": cache holds " + std::to_string(table.committed_slots) +
             " committed slots but the request processed " + std::to_string(request.processed));
    }
    if (table.blocks.size() * block_size < table.committed_slots) {
      report("request " + std::to_string(request.serial) + ": blocks cannot hold its committed slots");
    }
    const size_t upper = std::max(request.processed, request.tokens.size());
    if (table.blocks.size() > cache.BlocksFor(upper)) {
      report("request " + std::to_string(request.serial) + " owns more blocks than its sequence needs");
    }
  }
  return tables_in_use;
}

// Each block is in exactly one place: free, evictable, or held (its reference count equal to its
// holders); the prefix cache's evictable count matches; no reservation outlived its transaction.
void CheckBlockPlaces(const PagedKeyValueCache& cache, const std::vector<int>& free_marks,
                      const std::vector<int>& holders, Violations& report) {
  const size_t total = cache.total_blocks();
  const PrefixCache* prefix = cache.prefix();
  size_t evictable = 0;
  for (size_t block = 0; block < total; ++block) {
    const int32_t id = static_cast<int32_t>(block);
    const bool indexed = prefix != nullptr && prefix->indexed(id);
    const bool is_evictable = prefix != nullptr && prefix->evictable(id);
    evictable += is_evictable ? 1 : 0;
    if (cache.references(id) != holders[block]) {
      report("block " + std::to_string(block) + " has " + std::to_string(cache.references(id)) +
             " references but " + std::to_string(holders[block]) + " holders");
    }
    const int places = free_marks[block] + (is_evictable ? 1 : 0) + (holders[block] > 0 ? 1 : 0);
    if (places == 0) report("block " + std::to_string(block) + " is lost (free nowhere, owned by nobody)");
    if (places > 1) report("block " + std::to_string(block) + " is in more than one place (free, evictable, held)");
    if (free_marks[block] > 0 && indexed) report("free block " + std::to_string(block) + " is still indexed");
    if (is_evictable && (!indexed || holders[block] > 0)) {
      report("evictable block " + std::to_string(block) + " is not an unreferenced indexed block");
    }
  }
  if (prefix != nullptr && prefix->evictable_count() != evictable) {
    report("the prefix cache counts " + std::to_string(prefix->evictable_count()) + " evictable blocks, " +
           std::to_string(evictable) + " are");
  }
  if (cache.reservation_live()) report("a step reservation outlived its transaction");
}

// Blocks: each id is free, evictable (indexed by the prefix cache, referenced by nobody), or
// referenced -- by one table, or by several when the prefix cache shares it -- with its reference
// count equal to the tables and reservation entries holding it. Returns the tables in use.
size_t CheckBlocks(const PagedKeyValueCache& cache, Violations& report) {
  const size_t total = cache.total_blocks();
  std::vector<int> free_marks(total, 0);
  std::vector<int> holders(total, 0);
  for (int32_t block : cache.pool().free_blocks()) {
    if (InRange(block, total, "the free list", report) && ++free_marks[static_cast<size_t>(block)] > 1) {
      report("block " + std::to_string(block) + " is on the free list twice");
    }
  }
  for (int32_t block : cache.reserved_blocks()) {
    if (InRange(block, total, "the step reservation", report)) ++holders[static_cast<size_t>(block)];
  }
  const size_t tables_in_use = CheckBlockTables(cache, holders, report);
  CheckBlockPlaces(cache, free_marks, holders, report);
  return tables_in_use;
}

// Composite state (hybrid models): paged and fixed committed ownership name the same requests,
// and each request's fixed state holds exactly its committed cache slots.
void CheckFixedState(const PagedKeyValueCache& cache, const FixedStatePool* fixed, size_t tables_in_use,
                     Violations& report) {
  const size_t total = cache.total_blocks();
  const size_t block_size = cache.block_size();
  const PrefixCache* prefix = cache.prefix();
  if (fixed->reservation_live()) report("a fixed-state reservation outlived its transaction");
  size_t owned = 0;
  for (size_t s = 0; s < fixed->slots().size(); ++s) {
    const FixedStateSlot& slot = fixed->slots()[s];
    if (slot.owner == nullptr) continue;
    ++owned;
    const Request& request = *slot.owner;
    const std::string name = "request " + std::to_string(request.serial);
    if (request.fixed_slot != static_cast<int32_t>(s)) report("fixed-state slot " + std::to_string(s) + " names " + name + " which does not point back to it");
    const BlockTable* table = cache.TableOf(request);
    if (table == nullptr || table->owner != &request) {
      report(name + " owns a fixed-state slot but no block table");
    } else if (table->committed_slots != slot.committed_tokens) {
      report(name + ": fixed state holds " + std::to_string(slot.committed_tokens) + " tokens, its cache " +
             std::to_string(table->committed_slots) + " committed slots");
    }
  }
  if (owned != tables_in_use) {
    report("fixed-state slots in use (" + std::to_string(owned) + ") != block tables in use (" +
           std::to_string(tables_in_use) + ")");
  }
  // Checkpoints: each belongs to one indexed block that maps back to it, at that block's end.
  for (size_t i = 0; i < fixed->checkpoints().size(); ++i) {
    const FixedStatePool::Checkpoint& checkpoint = fixed->checkpoints()[i];
    const std::string name = "fixed-state checkpoint " + std::to_string(i);
    if (checkpoint.pending_block >= 0) report(name + " is still pending");
    if (checkpoint.block < 0) continue;
    if (static_cast<size_t>(checkpoint.block) >= total || fixed->checkpoint_of(checkpoint.block) != static_cast<int32_t>(i)) {
      report(name + " names block " + std::to_string(checkpoint.block) + " which does not point back to it");
    } else if (prefix == nullptr || !prefix->indexed(checkpoint.block)) {
      report(name + " belongs to block " + std::to_string(checkpoint.block) + " which is not indexed");
    }
    if (checkpoint.tokens == 0 || checkpoint.tokens % block_size != 0) {
      report(name + " holds " + std::to_string(checkpoint.tokens) + " tokens, not a block boundary");
    }
  }
}

// Scheduler membership.
void CheckScheduler(const DynamicBatchScheduler& scheduler, size_t tables_in_use, size_t max_batch_size,
                    Violations& report) {
  if (scheduler.residents().size() != tables_in_use) {
    report("scheduler residents (" + std::to_string(scheduler.residents().size()) + ") != block tables in use (" +
           std::to_string(tables_in_use) + ")");
  }
  if (scheduler.residents().size() > max_batch_size) report("more residents than max_batch_size");
  for (const Request* request : scheduler.residents()) {
    if (request->cache_slot < 0) report("resident request " + std::to_string(request->serial) + " owns no block table");
    if (request->waiting) report("resident request " + std::to_string(request->serial) + " is also waiting");
  }
  for (const Request* request : scheduler.waiting()) {
    if (!request->waiting) report("waiting request " + std::to_string(request->serial) + " is not marked waiting");
    if (request->status != RequestStatus::Assigned) {
      report("waiting request " + std::to_string(request->serial) + " is " + StatusName(request->status));
    }
    if (request->cache_slot >= 0) report("waiting request " + std::to_string(request->serial) + " is resident");
  }
}

// The static batch.
void CheckStaticBatch(const StaticBatchScheduler& static_scheduler, size_t max_batch_size, Violations& report) {
  const std::vector<StaticRow>& rows = static_scheduler.rows();
  if (rows.size() > max_batch_size) report("the static batch has more rows than max_batch_size");
  for (size_t r = 0; r < rows.size(); ++r) {
    const Request& request = *rows[r].request;
    if (request.static_row != static_cast<int32_t>(r)) {
      report("static row " + std::to_string(r) + " names request " + std::to_string(request.serial) +
             " which does not point back to it");
    }
    if (!request.closed() && rows[r].processed != request.processed) {
      report("static row " + std::to_string(r) + " and its request disagree on the cached length");
    }
  }
  for (const Request* request : static_scheduler.waiting()) {
    if (!request->waiting || request->status != RequestStatus::Assigned || request->resident()) {
      report("waiting static request " + std::to_string(request->serial) + " is not a queued nonresident turn");
    }
  }
}

// One bound request: its own state, its retained events (`retained`, counted in the queue) and its
// fixed-state slot.
void CheckRequest(const Request& request, uint32_t retained_events, const PagedKeyValueCache& cache,
                  Violations& report) {
  const std::string name = "request " + std::to_string(request.serial);
  if (request.closed()) report(name + " is closed but still bound");
  if (request.processed > request.tokens.size()) report(name + " processed more tokens than its sequence holds");
  if (request.retained_events != retained_events) {
    report(name + " counts " + std::to_string(request.retained_events) + " retained events, the queue holds " +
           std::to_string(retained_events));
  }
  const bool resident = request.resident();
  if (request.fixed_slot >= 0) {
    const FixedStatePool* fixed = cache.fixed_state();
    if (fixed == nullptr || static_cast<size_t>(request.fixed_slot) >= fixed->slots().size() ||
        fixed->slots()[static_cast<size_t>(request.fixed_slot)].owner != &request) {
      report(name + " points to a fixed-state slot it does not own");
    }
  }
  switch (request.status) {
    case RequestStatus::Unassigned:
      // turn_id may be nonzero here only through OgaExtRequestSetLastTurnIdForTesting.
      if (resident || request.waiting || request.processed != 0) report(name + " is Unassigned but has turn state");
      break;
    case RequestStatus::Assigned:
      if (resident == request.waiting) report(name + " is Assigned but neither waiting nor resident (or both)");
      if (request.unprocessed() == 0) report(name + " is Assigned without input");
      break;
    case RequestStatus::Active:
      if (!resident) report(name + " is Active but not resident");
      // A Generator row whose logits are held has run its pending token already.
      if (request.unprocessed() != (request.logits_held ? 0u : 1u)) {
        report(name + " is Active with " + std::to_string(request.unprocessed()) + " unprocessed tokens");
      }
      break;
    case RequestStatus::TurnComplete:
      if (request.waiting) report(name + " is TurnComplete but still waiting");
      break;
    case RequestStatus::Closed:
      break;
  }
  if (request.tokens.size() >= request.max_session_tokens + 1) report(name + " exceeds max_session_tokens");
  if (request.recomputing && request.status != RequestStatus::Assigned) {
    report(name + " is recomputing a preempted cache but is " + StatusName(request.status));
  }
  if (request.recompute_until > request.tokens.size()) report(name + " recomputes past its sequence");
}

}  // namespace

std::string Engine::CheckInvariants() const {
  Violations report;
  const size_t tables_in_use = CheckBlocks(cache_, report);
  if (const FixedStatePool* fixed = cache_.fixed_state()) CheckFixedState(cache_, fixed, tables_in_use, report);
  CheckScheduler(scheduler_, tables_in_use, limits_.max_batch_size, report);
  if (static_scheduler_) CheckStaticBatch(*static_scheduler_, limits_.max_batch_size, report);
  // Requests.
  std::vector<uint32_t> retained(bound_.size(), 0);
  for (size_t i = 0; i < pending_.size(); ++i) {
    const EngineEvent& event = pending_.At(i);
    if (!event.request) continue;
    bool found = false;
    for (size_t b = 0; b < bound_.size(); ++b) {
      if (bound_[b].get() == event.request.get()) {
        ++retained[b];
        found = true;
      }
    }
    if (!found) report("a retained event names a request the engine no longer holds");
  }
  for (size_t b = 0; b < bound_.size(); ++b) CheckRequest(*bound_[b], retained[b], cache_, report);
  return report.str();
}

}  // namespace oga
