#include "cache/fixed_state_pool.h"

#include <limits>
#include <new>
#include <stdexcept>
#include <string>

#include "base/errors.h"
#include "base/fault_injector.h"
#include "request/request.h"

namespace oga {

FixedStatePool::FixedStatePool(const std::vector<size_t>& row_bytes, size_t capacity, size_t max_tokens, bool capture,
                               FaultInjector* faults, size_t checkpoints, const OgaExtDeviceOps* device)
    : memory_(device),
      copy_sources_(capacity),
      copy_destinations_(capacity),
      slots_(capacity),
      taken_(capacity, 0),
      capture_(capture),
      faults_(faults),
      checkpoints_(checkpoints) {
  checkpoint_copies_.reserve(capacity);
  if (row_bytes.empty() || capacity == 0) throw ContractError("a fixed-state pool needs tensors and slots");
  tensors_.resize(row_bytes.size());
  try {
    for (size_t t = 0; t < row_bytes.size(); ++t) {
      const size_t row = row_bytes[t];
      if (row == 0) throw ContractError("a fixed state tensor has an empty row");
      // banks 0 and 1, gather, staging, captures, checkpoints, the zero row: one allocation per tensor.
      const size_t capture_rows = capture ? max_tokens : 0;
      const size_t rows = 4 * capacity + capture_rows + checkpoints + 1;
      if (rows > std::numeric_limits<size_t>::max() / row) throw std::bad_alloc();
      uint8_t* memory = memory_.Allocate(rows * row);
      allocations_.push_back(memory);
      Tensor& tensor = tensors_[t];
      tensor.row_bytes = row;
      tensor.banks[0] = memory;
      tensor.banks[1] = memory + capacity * row;
      tensor.gather = memory + 2 * capacity * row;
      tensor.staging = memory + 3 * capacity * row;
      tensor.captured = capture ? memory + 4 * capacity * row : nullptr;
      tensor.checkpoints = memory + (4 * capacity + capture_rows) * row;
      tensor.zero = memory + (rows - 1) * row;
      memory_.FillZero(tensor.zero, row);
      total_row_bytes_ += row;
      persistent_bytes_ += (rows - 1) * row;
    }
    memory_.Synchronize();
  } catch (...) {
    for (uint8_t* memory : allocations_) memory_.Release(memory);
    throw;
  }
  rows_.reserve(capacity);
  inputs_.resize(tensors_.size());
  outputs_.resize(tensors_.size());
  captures_.resize(tensors_.size());
  for (size_t t = 0; t < tensors_.size(); ++t) captures_[t] = tensors_[t].captured;
}

FixedStatePool::~FixedStatePool() {
  for (uint8_t* memory : allocations_) memory_.Release(memory);
}

int32_t FixedStatePool::TakeFreeSlot() {
  // The lowest free slot keeps residents packed at the bottom, so they tend to form one interval.
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].owner == nullptr && taken_[s] == 0) return static_cast<int32_t>(s);
  }
  return -1;
}

void FixedStatePool::ReturnProvisional() noexcept {
  for (const Row& row : rows_) {
    if (row.slot >= 0) taken_[static_cast<size_t>(row.slot)] = 0;
  }
  for (Checkpoint& checkpoint : checkpoints_) checkpoint.pending_block = -1;
}

int32_t FixedStatePool::TakeCheckpointVictim(int32_t ancestor) noexcept {
  int32_t victim = -1;
  for (size_t i = 0; i < checkpoints_.size(); ++i) {
    const Checkpoint& checkpoint = checkpoints_[i];
    if (checkpoint.pending_block >= 0) continue;
    if (checkpoint.block < 0) return static_cast<int32_t>(i);
    if (victim < 0 || checkpoint.last_use < checkpoints_[static_cast<size_t>(victim)].last_use) {
      victim = static_cast<int32_t>(i);
    }
  }
  if (ancestor >= 0) {
    const Checkpoint& preferred = checkpoints_[static_cast<size_t>(ancestor)];
    if (preferred.pending_block < 0 && preferred.block >= 0) return ancestor;
  }
  return victim;
}

void FixedStatePool::Reserve(const StepPlan& plan) {
  if (!healthy_) throw ContractError("the fixed-state pool is unhealthy after a failed commit preparation");
  if (reservation_live()) throw ContractError("a fixed-state reservation is already live");
  if (plan.rows.empty()) throw ContractError("a fixed-state reservation needs at least one row");
  if (plan.rows.size() > slots_.size()) throw ContractError("the step has more rows than fixed-state slots");
  rows_.clear();
  new_slots_ = 0;
  size_t on_bank[2] = {0, 0};
  for (const RequestStepPlan& planned : plan.rows) {
    Row row;
    row.request = planned.request;
    const int32_t owned = planned.request->fixed_slot;
    if (owned >= 0) {
      if (static_cast<size_t>(owned) >= slots_.size() || slots_[static_cast<size_t>(owned)].owner != planned.request ||
          taken_[static_cast<size_t>(owned)] != 0) {
        ReturnProvisional();
        rows_.clear();
        throw ContractError("a request's fixed-state slot is not its own, or it is reserved twice");
      }
      const FixedStateSlot& slot = slots_[static_cast<size_t>(owned)];
      row.slot = owned;
      row.allocation_generation = slot.allocation_generation;
      row.state_generation = slot.state_generation;
      row.committed_tokens = slot.committed_tokens;
      row.active_bank = slot.active_bank;
      ++on_bank[slot.active_bank];
    } else {
      row.slot = TakeFreeSlot();
      if (row.slot < 0) {
        ReturnProvisional();
        rows_.clear();
        throw ContractError("no free fixed-state slot for a newly admitted request");
      }
      row.provisional = true;
      ++new_slots_;
      if (planned.cached_blocks > 0) {
        // Adopted cached blocks: the state continues from the checkpoint of the last one.
        const int32_t block = plan.cached_block_ids[planned.cached_begin + planned.cached_blocks - 1];
        row.checkpoint = checkpoint_of(block);
        if (row.checkpoint < 0) {
          ReturnProvisional();
          rows_.clear();
          throw ContractError("a planned prefix-cache adoption has no fixed-state checkpoint");
        }
        row.checkpoint_block = block;
      }
    }
    taken_[static_cast<size_t>(row.slot)] = 1;
    rows_.push_back(row);
  }
  // A free slot has no visible bank: align it with the resident cohort, so that after this step
  // (every row flips) it sits on the same bank as the residents and the next step can bind directly.
  const uint8_t cohort = on_bank[1] > on_bank[0] ? 1 : 0;
  for (Row& row : rows_) {
    if (!row.provisional) continue;
    slots_[static_cast<size_t>(row.slot)].active_bank = cohort;
    row.active_bank = cohort;
  }
  try {
    direct_ = !fallback_only_ && new_slots_ == 0 && BindDirect();
    if (!direct_) BindFallback();
  } catch (...) {
    // A failed device copy: resident selectors are unchanged until their copies synchronized.
    ReturnProvisional();
    rows_.clear();
    throw;
  }
  state_ = State::Reserved;
}

bool FixedStatePool::BindDirect() {
  const int32_t first = rows_.front().slot;
  size_t on_bank[2] = {0, 0};
  for (size_t r = 0; r < rows_.size(); ++r) {
    if (rows_[r].slot != first + static_cast<int32_t>(r)) return false;  // not one ascending interval
    ++on_bank[rows_[r].active_bank];
  }
  const uint8_t canonical = on_bank[1] > on_bank[0] ? 1 : 0;
  // Copy the minority rows' visible state into the canonical bank (their inactive one), then --
  // once the copies are complete -- select it: the same state, now in the interval the model reads.
  if (on_bank[canonical ^ 1] > 0) {
    for (size_t t = 0; t < tensors_.size(); ++t) {
      size_t n = 0;
      for (const Row& row : rows_) {
        if (row.active_bank == canonical) continue;
        copy_sources_[n] = BankRow(t, row.active_bank, static_cast<size_t>(row.slot));
        copy_destinations_[n++] = BankRow(t, canonical, static_cast<size_t>(row.slot));
      }
      memory_.Copy(n, copy_sources_.data(), copy_destinations_.data(), tensors_[t].row_bytes);
    }
    memory_.Synchronize();
    for (Row& row : rows_) {
      slots_[static_cast<size_t>(row.slot)].active_bank = canonical;
      row.active_bank = canonical;
    }
  }
  for (size_t t = 0; t < tensors_.size(); ++t) {
    inputs_[t] = BankRow(t, canonical, static_cast<size_t>(first));
    outputs_[t] = BankRow(t, static_cast<uint8_t>(canonical ^ 1), static_cast<size_t>(first));
  }
  return true;
}

void FixedStatePool::BindFallback() {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const Tensor& tensor = tensors_[t];
    for (size_t r = 0; r < rows_.size(); ++r) {
      const Row& row = rows_[r];
      copy_sources_[r] = !row.provisional        ? BankRow(t, row.active_bank, static_cast<size_t>(row.slot))
                         : row.checkpoint >= 0 ? CheckpointRow(t, static_cast<size_t>(row.checkpoint))
                                               : tensor.zero;
      copy_destinations_[r] = tensor.gather + r * tensor.row_bytes;
    }
    memory_.Copy(rows_.size(), copy_sources_.data(), copy_destinations_.data(), tensor.row_bytes);
    inputs_[t] = tensor.gather;
    outputs_[t] = tensor.staging;
  }
  memory_.Synchronize();  // the model may read them on another stream
}

void FixedStatePool::ValidateCommit(const StepPlan& plan) const {
  if (state_ != State::Reserved) throw ContractError("fixed-state commit without a reserved fixed-state reservation");
  if (plan.rows.size() != rows_.size()) throw ContractError("the fixed-state reservation does not match the plan's rows");
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Row& row = rows_[r];
    const RequestStepPlan& planned = plan.rows[r];
    if (planned.request != row.request) throw ContractError("a fixed-state row belongs to another request than planned");
    const FixedStateSlot& slot = slots_[static_cast<size_t>(row.slot)];
    if (row.provisional) {
      const Checkpoint* checkpoint =
          row.checkpoint >= 0 ? &checkpoints_[static_cast<size_t>(row.checkpoint)] : nullptr;
      if (slot.owner != nullptr || row.request->fixed_slot >= 0 ||
          planned.processed_before != (checkpoint != nullptr ? checkpoint->tokens : 0) ||
          (checkpoint != nullptr && checkpoint->block != row.checkpoint_block)) {
        throw ContractError(
            "a provisional fixed-state slot was taken, or its request does not start from its zero state or checkpoint");
      }
    } else if (slot.owner != row.request || row.request->fixed_slot != row.slot ||
               slot.allocation_generation != row.allocation_generation ||
               slot.state_generation != row.state_generation || slot.committed_tokens != row.committed_tokens ||
               slot.active_bank != row.active_bank) {
      throw ContractError("a resident fixed-state slot changed since it was reserved");
    } else if (slot.committed_tokens != planned.processed_before) {
      throw ContractError("a fixed-state slot's committed tokens differ from the request's committed cache slots");
    }
    if (slot.state_generation == std::numeric_limits<uint64_t>::max() ||
        slot.allocation_generation == std::numeric_limits<uint64_t>::max()) {
      throw ContractError("a fixed-state generation would overflow");
    }
    if (planned.accepted_drafts > planned.draft_count) throw ContractError("more accepted drafts than verified");
    if (planned.accepted_drafts < planned.draft_count && !capture_) {
      throw ContractError("a partially accepted draft proposal needs the decoder's per-token fixed state");
    }
  }
}

const uint8_t* FixedStatePool::NewStateSource(size_t tensor, size_t r, const RequestStepPlan& row) const {
  const Tensor& t = tensors_[tensor];
  if (row.accepted_drafts < row.draft_count) {
    // Compact replay: the state after the last accepted token, which the decoder captured.
    const size_t token = row.packed_offset + row.token_count + row.accepted_drafts - 1;
    return t.captured + token * t.row_bytes;
  }
  return direct_ ? nullptr : t.staging + r * t.row_bytes;
}

void FixedStatePool::PrepareCommit(const StepPlan& plan, const std::vector<CheckpointRequest>& checkpoints) {
  ValidateCommit(plan);
  const OgaExtExecutionStatus fault =
      faults_ != nullptr ? faults_->Consult(OgaExtFaultPhase_FixedStatePrepare) : OgaExtExecutionStatus_Ok;
  const bool fail = fault != OgaExtExecutionStatus_Ok;
  try {
    // An injected failure writes half of the rows first, as a device failure part-way would.
    const size_t rows = fail ? rows_.size() / 2 : rows_.size();
    for (size_t t = 0; t < tensors_.size(); ++t) {
      size_t n = 0;
      for (size_t r = 0; r < rows; ++r) {
        const uint8_t* source = NewStateSource(t, r, plan.rows[r]);
        if (source == nullptr) continue;  // a direct output already is the new state
        copy_sources_[n] = source;
        copy_destinations_[n++] =
            BankRow(t, static_cast<uint8_t>(rows_[r].active_bank ^ 1), static_cast<size_t>(rows_[r].slot));
      }
      memory_.Copy(n, copy_sources_.data(), copy_destinations_.data(), tensors_[t].row_bytes);
    }
    if (fail) {
      memory_.Synchronize();
      if (fault == OgaExtExecutionStatus_Interrupted) throw InterruptedError("injected fixed-state interruption");
      throw std::runtime_error("injected fixed-state commit-preparation fault");
    }
    // Checkpoints: an adoption is a use (before this step's new checkpoints choose victims); the new
    // state, now whole in the inactive bank, is copied for later adoptions.
    for (const Row& row : rows_) {
      if (row.checkpoint >= 0) checkpoints_[static_cast<size_t>(row.checkpoint)].last_use = ++clock_;
    }
    checkpoint_copies_.clear();
    for (const CheckpointRequest& request : checkpoints) {
      const int32_t victim = TakeCheckpointVictim(request.ancestor);
      if (victim < 0) break;  // every checkpoint was written by this step already
      Checkpoint& checkpoint = checkpoints_[static_cast<size_t>(victim)];
      if (checkpoint.block >= 0) DropCheckpoint(checkpoint.block);
      const RequestStepPlan& planned = plan.rows[request.row];
      checkpoint.pending_block = request.block;
      checkpoint.tokens = planned.processed_before + planned.committed_tokens();
      checkpoint_copies_.emplace_back(victim, request.row);
    }
    for (size_t t = 0; t < tensors_.size() && !checkpoint_copies_.empty(); ++t) {
      for (size_t i = 0; i < checkpoint_copies_.size(); ++i) {
        const Row& row = rows_[checkpoint_copies_[i].second];
        copy_sources_[i] = BankRow(t, static_cast<uint8_t>(row.active_bank ^ 1), static_cast<size_t>(row.slot));
        copy_destinations_[i] = CheckpointRow(t, static_cast<size_t>(checkpoint_copies_[i].first));
      }
      memory_.Copy(checkpoint_copies_.size(), copy_sources_.data(), copy_destinations_.data(), tensors_[t].row_bytes);
    }
    memory_.Synchronize();
  } catch (const InterruptedError&) {
    // The device is intact and only inactive banks and unpublished checkpoint rows were written,
    // which a retry writes again: still Reserved, for the engine's rollback (Discard).
    throw;
  } catch (...) {
    // The inactive banks may be half written: nothing proves them whole for a retry.
    healthy_ = false;
    ReturnProvisional();
    state_ = State::Failed;
    throw;
  }
  state_ = State::Prepared;
}

bool FixedStatePool::PublishCommit(const StepPlan& plan) noexcept {
  if (state_ != State::Prepared || plan.rows.size() != rows_.size()) return false;
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Row& row = rows_[r];
    FixedStateSlot& slot = slots_[static_cast<size_t>(row.slot)];
    if (row.provisional) {
      slot.owner = row.request;
      ++slot.allocation_generation;
      row.request->fixed_slot = row.slot;
    }

    slot.active_bank ^= 1;
    ++slot.state_generation;
    slot.committed_tokens = plan.rows[r].processed_before + plan.rows[r].committed_tokens();
    taken_[static_cast<size_t>(row.slot)] = 0;
  }
  state_ = State::Idle;
  return true;
}

void FixedStatePool::Discard() noexcept {
  if (state_ != State::Reserved && state_ != State::Prepared) return;
  ReturnProvisional();  // also unpins checkpoints and drops unmapped new ones
  state_ = State::Idle;
}

void FixedStatePool::Release(Request& request) noexcept {
  if (request.fixed_slot < 0) return;
  FixedStateSlot& slot = slots_[static_cast<size_t>(request.fixed_slot)];
  slot.owner = nullptr;
  slot.committed_tokens = 0;
  request.fixed_slot = -1;
}

}  // namespace oga
