// FixedStatePool: request-indexed fixed decoder state (fixed_conv / fixed_recurrent groups) for
// hybrid models (seed: "Fixed request-state pools").
//
// Each resident request owns one slot. Every fixed tensor has two persistent banks of
// [capacity, row] bytes, and each slot records which bank is active (holds its visible committed
// state). A step writes new state only into inactive memory -- the inactive bank itself (direct
// binding) or output staging (fallback) -- so a step that fails before publication leaves every
// committed state exactly as it was, and publication is a host-only bank flip:
//
//   Reserve         rows in plan order: residents keep their slot, others take a free slot
//                   provisionally. An all-resident plan whose slots form a contiguous interval
//                   (the scheduler orders such plans by slot) binds that interval of the active
//                   bank as input and of the inactive bank as output, after copying any minority
//                   rows into the majority's bank (representation only: the state does not change).
//                   Otherwise each row's state (zeros for a provisional slot) is gathered into
//                   contiguous input rows and the model writes distinct output staging rows.
//   ValidateCommit  const: the checkpointed slots are where Reserve left them; no regression.
//   PrepareCommit   the fallible copies: staged outputs (or, for a partially accepted draft
//                   proposal, the captured state after its last accepted token) into each slot's
//                   inactive bank. A failure marks the pool unhealthy: the inactive banks may be
//                   half written, though every active bank is intact. An interrupted device
//                   operation (InterruptedError) does not: the device is intact, the reservation
//                   stays Reserved for Discard, and a retry writes those banks again.
//   PublishCommit   noexcept: flip banks, advance generations and committed tokens, publish
//                   provisional ownership.
//   Discard         from Reserved or Prepared: provisional slots go back; residents untouched.
//
// Prefix caching (as onnxruntime-genai 0.18 does for hybrid models): a cached block carries no fixed
// state, so a new request may adopt cached blocks only up to a fixed-state checkpoint -- a copy of
// the state a prefill step committed when it ended exactly on a block boundary, keyed by the prefix
// cache block ending there. `checkpoints` rows per tensor hold them (0.18 keeps max_batch_size),
// replaced least recently used first (adoption counts as use). A request admitted on a checkpoint
// gathers it instead of the zero row. A checkpoint is written by PrepareCommit (its victim is
// dropped there), mapped after the step's blocks were indexed, and dropped when its block leaves
// the prefix cache.
//
// All of it lives where the executor's session runs (DeviceMemory: the executor's OgaExtDeviceOps,
// or host memory); copies are batched per tensor and synchronized before anything depends on them.
//
// Only one reservation is live at a time. Memory is allocated once at construction: both banks,
// gather and staging buffers sized for `capacity` rows, per-token capture buffers for
// `max_tokens` tokens when the decoder captures, and one zero row per tensor (the gather source of
// a new request). Nothing else is ever zeroed: a bank row is written before it becomes visible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cache/device_memory.h"
#include "plan/step_plan.h"

namespace oga {

class FaultInjector;
class Request;

struct FixedStateSlot {
  const Request* owner = nullptr;  // nullptr = free
  uint64_t allocation_generation = 0;
  uint64_t state_generation = 0;
  size_t committed_tokens = 0;
  uint8_t active_bank = 0;
};

class FixedStatePool {
 public:
  // `row_bytes`: one request's row of each fixed tensor. `capture`: the decoder also writes every
  // packed token's state into [max_tokens, row] capture buffers.
  // `checkpoints` > 0 (prefix caching) keeps that many checkpoint rows (see IndexCheckpointsOver).
  FixedStatePool(const std::vector<size_t>& row_bytes, size_t capacity, size_t max_tokens, bool capture,
                 FaultInjector* faults, size_t checkpoints = 0, const OgaExtDeviceOps* device = nullptr);
  ~FixedStatePool();
  FixedStatePool(const FixedStatePool&) = delete;
  FixedStatePool& operator=(const FixedStatePool&) = delete;

  size_t tensor_count() const { return tensors_.size(); }
  size_t capacity() const { return slots_.size(); }
  size_t row_bytes(size_t tensor) const { return tensors_[tensor].row_bytes; }
  // Bytes of one row over every tensor.
  size_t total_row_bytes() const { return total_row_bytes_; }
  // Bytes the persistent banks and the staging buffers occupy (allocated at construction).
  size_t persistent_bytes() const { return persistent_bytes_; }
  bool capture() const { return capture_; }
  bool healthy() const { return healthy_; }
  bool host_memory() const { return memory_.host(); }
  // Benchmarks and tests: never bind bank views directly.
  void set_fallback_only(bool fallback_only) { fallback_only_ = fallback_only; }

  // Reserves every plan row (throws ContractError and reserves nothing on failure).
  void Reserve(const StepPlan& plan);
  bool reservation_live() const { return state_ == State::Reserved || state_ == State::Prepared; }

  // The live reservation, in plan row order (valid until the next Reserve or Discard).
  size_t reserved_rows() const { return rows_.size(); }
  size_t reserved_new_slots() const { return new_slots_; }
  // Bytes the step's input and output bindings span (direct views overlap the banks).
  size_t reserved_binding_bytes() const { return rows_.size() * total_row_bytes_ * 2; }
  const Request* reserved_owner(size_t row) const { return rows_[row].request; }
  bool direct() const { return direct_; }
  const void* const* inputs() const { return inputs_.data(); }
  void* const* outputs() const { return outputs_.data(); }
  void* const* captures() const { return capture_ ? captures_.data() : nullptr; }

  // Throws ContractError when publishing the plan would be wrong; changes nothing.
  void ValidateCommit(const StepPlan& plan) const;
  // A plan row whose new state becomes a checkpoint for `block` (the block its step ends with).
  // `ancestor`: the least recently used checkpoint of a shorter prefix of the same tokens, which a
  // full pool replaces first (0.18 does so; observed), -1 = none.
  struct CheckpointRequest {
    size_t row = 0;
    int32_t block = -1;
    int32_t ancestor = -1;
  };
  // Writes every row's new state into its slot's inactive bank, and the requested checkpoints
  // (each replacing a free checkpoint, an ancestor, or the least recently used one; a checkpoint this
  // step's admissions read was gathered at Reserve and may go). On failure the pool is
  // unhealthy, the reservation's provisional slots are returned, and the error is rethrown.
  void PrepareCommit(const StepPlan& plan, const std::vector<CheckpointRequest>& checkpoints = {});
  // Makes the prepared state visible. Returns false (and changes nothing) unless the reservation
  // is prepared for this plan: a state-machine misuse the caller treats as fatal.
  bool PublishCommit(const StepPlan& plan) noexcept;
  // Drops a reserved or prepared reservation: provisional slots return, residents keep their state.
  void Discard() noexcept;
  // Frees the slot `request` owns (close, abandonment, unserviceable, rewind).
  void Release(Request& request) noexcept;

  // Checkpoints (prefix caching) are keyed by the blocks [0, num_blocks) of the paged pool, which is
  // sized after this pool; called once, before the first step.
  void IndexCheckpointsOver(size_t num_blocks) {
    if (!checkpoints_.empty()) block_checkpoint_.assign(num_blocks, -1);
  }
  bool checkpoints_enabled() const { return !block_checkpoint_.empty(); }
  // Whether adopting cached blocks up to and including `block` has the state to continue from.
  bool HasCheckpoint(int32_t block) const {
    return !block_checkpoint_.empty() && block_checkpoint_[static_cast<size_t>(block)] >= 0;
  }
  // After the step's blocks were indexed: the checkpoint PrepareCommit wrote for `pending_block`
  // belongs to `indexed_block`, the indexed block with the same content and prefix (the step's own
  // block, or the one it duplicates); kept only if that block has no checkpoint yet (-1: dropped).
  void PublishCheckpoint(int32_t pending_block, int32_t indexed_block) noexcept {
    for (size_t i = 0; i < checkpoints_.size(); ++i) {
      Checkpoint& checkpoint = checkpoints_[i];
      if (checkpoint.pending_block != pending_block) continue;
      checkpoint.pending_block = -1;
      if (indexed_block < 0 || block_checkpoint_[static_cast<size_t>(indexed_block)] >= 0) return;
      checkpoint.block = indexed_block;
      checkpoint.last_use = ++clock_;
      block_checkpoint_[static_cast<size_t>(indexed_block)] = static_cast<int32_t>(i);
      return;
    }
  }
  // Frees the checkpoints this step wrote that no PublishCheckpoint placed.
  void EndCheckpointPublication() noexcept {
    for (Checkpoint& checkpoint : checkpoints_) checkpoint.pending_block = -1;
  }
  // `block` left the prefix cache (freed or evicted): its checkpoint goes.
  void DropCheckpoint(int32_t block) noexcept {
    if (block_checkpoint_.empty()) return;
    int32_t& index = block_checkpoint_[static_cast<size_t>(block)];
    if (index < 0) return;
    checkpoints_[static_cast<size_t>(index)].block = -1;
    index = -1;
  }
  struct Checkpoint {
    int32_t block = -1;          // the indexed block it belongs to; -1 = free
    int32_t pending_block = -1;  // written by the prepared step, mapped after indexing
    size_t tokens = 0;           // tokens the state holds (the block's end)
    uint64_t last_use = 0;
  };
  const std::vector<Checkpoint>& checkpoints() const { return checkpoints_; }
  uint64_t checkpoint_last_use(int32_t checkpoint) const { return checkpoints_[static_cast<size_t>(checkpoint)].last_use; }
  int32_t checkpoint_of(int32_t block) const {
    return block_checkpoint_.empty() ? -1 : block_checkpoint_[static_cast<size_t>(block)];
  }

  // For the invariant checker and introspection.
  const std::vector<FixedStateSlot>& slots() const { return slots_; }
  const uint8_t* ActiveRow(size_t tensor, int32_t slot) const {
    const FixedStateSlot& s = slots_[static_cast<size_t>(slot)];
    return BankRow(tensor, s.active_bank, static_cast<size_t>(slot));
  }

 private:
  enum class State { Idle, Reserved, Prepared, Failed };

  struct Tensor {
    size_t row_bytes = 0;
    uint8_t* banks[2] = {nullptr, nullptr};  // [capacity, row] each
    uint8_t* gather = nullptr;               // [capacity, row]
    uint8_t* staging = nullptr;              // [capacity, row]
    uint8_t* captured = nullptr;             // [max_tokens, row], capture only
    uint8_t* zero = nullptr;                 // [row] zeros
    uint8_t* checkpoints = nullptr;          // [checkpoints, row]
  };

  // One reserved row: where its state lives and what Reserve saw of the slot.
  struct Row {
    Request* request = nullptr;
    int32_t slot = -1;
    bool provisional = false;
    int32_t checkpoint = -1;             // provisional rows admitted on a prefix-cache checkpoint
    int32_t checkpoint_block = -1;       // the block it belonged to at Reserve
    uint64_t allocation_generation = 0;  // as Reserve saw the slot (residents)
    uint64_t state_generation = 0;
    size_t committed_tokens = 0;
    uint8_t active_bank = 0;
  };

  uint8_t* BankRow(size_t tensor, uint8_t bank, size_t slot) const {
    return tensors_[tensor].banks[bank] + slot * tensors_[tensor].row_bytes;
  }
  // The lowest free slot not already taken by this reservation, or -1.
  int32_t TakeFreeSlot();
  // Chooses direct binding when the rows are residents on a contiguous slot interval, normalizing
  // minority banks; returns whether it did.
  bool BindDirect();
  void BindFallback();
  void ReturnProvisional() noexcept;
  // A checkpoint row for a new checkpoint: a free one, else `ancestor` (see CheckpointRequest), else
  // the least recently used one; never one this step wrote already; -1 when every one is.
  int32_t TakeCheckpointVictim(int32_t ancestor) noexcept;
  uint8_t* CheckpointRow(size_t tensor, size_t checkpoint) const {
    return tensors_[tensor].checkpoints + checkpoint * tensors_[tensor].row_bytes;
  }
  // The source of row `r`'s new state for `plan` (staging, a captured token, or null when the
  // direct output already holds it).
  const uint8_t* NewStateSource(size_t tensor, size_t r, const RequestStepPlan& row) const;

  DeviceMemory memory_;
  std::vector<Tensor> tensors_;
  std::vector<uint8_t*> allocations_;
  // One batch of row copies (preallocated at `capacity` rows).
  std::vector<const void*> copy_sources_;
  std::vector<void*> copy_destinations_;
  std::vector<std::pair<int32_t, size_t>> checkpoint_copies_;  // (checkpoint, reserved row) of a step
  std::vector<FixedStateSlot> slots_;
  std::vector<uint8_t> taken_;  // per slot: taken provisionally by the live reservation
  size_t total_row_bytes_ = 0;
  size_t persistent_bytes_ = 0;
  bool capture_ = false;
  FaultInjector* faults_ = nullptr;
  bool fallback_only_ = false;
  bool healthy_ = true;

  State state_ = State::Idle;
  std::vector<Row> rows_;
  size_t new_slots_ = 0;
  bool direct_ = false;
  std::vector<const void*> inputs_;
  std::vector<void*> outputs_;
  std::vector<void*> captures_;

  std::vector<Checkpoint> checkpoints_;
  std::vector<int32_t> block_checkpoint_;  // per block: its checkpoint, -1 = none
  uint64_t clock_ = 0;
};

}  // namespace oga
