// The live reservation of one step (the seed's component "Speculative cache reservation"): the
// blocks each plan row
// took for the step -- the cached blocks it adopts first, then new ones, in the order its table
// will hold them -- and the block-table slot each row has, or gets at commit. The model sees a row's
// committed blocks followed by these; Commit moves them into the tables, Discard drops them.
//
// Invariants (kept by PagedKeyValueCache, checked by the engine's invariant checker): at most one
// reservation is live; while live it holds exactly one reference on every block it lists; rows are
// in plan order and their ranges tile blocks() without gaps. Capacity is allocated once, so a step
// never allocates here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oga {

class PagedCacheReservation {
 public:
  PagedCacheReservation(size_t max_blocks, size_t max_rows);

  bool live() const { return live_; }
  // Starts an empty reservation; throws ContractError when one is already live.
  void Begin();
  // Opens the next plan row's range; `table_slot` is the row's block table (an admission's: the
  // one Commit will give it, or -1 when none is free).
  void BeginRow(int32_t table_slot);
  // Appends a block to the open row.
  void Add(int32_t block) { blocks_.push_back(block); }
  // Closes the last row: the reservation is live.
  void Finish();
  // No longer live (the owner moved or dropped every reference it held).
  void Clear();

  size_t rows() const { return table_slots_.size(); }
  // Row `row`'s blocks are blocks()[row_begin(row), row_end(row)).
  size_t row_begin(size_t row) const { return begin_[row]; }
  size_t row_end(size_t row) const { return begin_[row + 1]; }
  size_t row_blocks(size_t row) const { return begin_[row + 1] - begin_[row]; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // The block-table slot of plan row `row`, or -1 (no such row, or an admission without one).
  int32_t table_slot(size_t row) const { return row < table_slots_.size() ? table_slots_[row] : -1; }

 private:
  std::vector<int32_t> blocks_;       // in take order, rows concatenated
  std::vector<size_t> begin_;         // per row: first index into blocks_, then the end
  std::vector<int32_t> table_slots_;  // per row
  bool live_ = false;
};

}  // namespace oga
