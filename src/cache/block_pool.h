// The pool of physical KV-cache blocks.
//
// Invariant (checked by engine_invariants.cpp): every block id in [0, total) is in exactly one
// place -- this free list, one request's block table, or the live step reservation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oga {

class BlockPool {
 public:
  explicit BlockPool(size_t total_blocks);

  size_t total() const { return total_; }
  size_t free_count() const { return free_.size(); }
  const std::vector<int32_t>& free_blocks() const { return free_; }

  // Pops one free block; the caller checked free_count().
  int32_t Take();
  // Returns a block; blocks given back in reverse order of Take restore the exact previous pool
  // state, so a rolled-back step retries on the same physical blocks.
  void Give(int32_t block);

 private:
  size_t total_;
  std::vector<int32_t> free_;  // a stack; Take pops from the back
};

}  // namespace oga
