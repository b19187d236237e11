#include "cache/block_pool.h"

#include <stdexcept>

namespace oga {

BlockPool::BlockPool(size_t total_blocks) : total_(total_blocks) {
  free_.reserve(total_blocks);
  // Lowest ids come out first.
  for (size_t i = total_blocks; i > 0; --i) free_.push_back(static_cast<int32_t>(i - 1));
}

int32_t BlockPool::Take() {
  if (free_.empty()) throw std::logic_error("BlockPool::Take on an empty pool");
  int32_t block = free_.back();
  free_.pop_back();
  return block;
}

void BlockPool::Give(int32_t block) {
  if (block < 0 || static_cast<size_t>(block) >= total_ || free_.size() >= total_) {
    throw std::logic_error("BlockPool::Give of a block the pool does not own");
  }
  free_.push_back(block);  // capacity reserved: never allocates
}

}  // namespace oga
