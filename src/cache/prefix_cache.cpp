#include "cache/prefix_cache.h"

#include <algorithm>
#include <cstring>

#include "base/mix64.h"

namespace oga {

PrefixCache::PrefixCache(size_t num_blocks, size_t block_size)
    : block_size_(block_size),
      key_(num_blocks, kNoKey),
      parent_(num_blocks, -1),
      parent_key_(num_blocks, kNoKey),
      tokens_(num_blocks * block_size),
      previous_(num_blocks, -1),
      next_(num_blocks, -1),
      in_lru_(num_blocks, 0) {
  size_t capacity = 16;
  while (capacity < 2 * num_blocks) capacity *= 2;  // load factor at most 1/2
  slots_.assign(capacity, -1);
}

uint64_t PrefixCache::KeyOf(int32_t parent, const int32_t* tokens) const {
  // The parent's key (not its id) chains the content of the whole prefix.
  uint64_t key = parent < 0 ? 0x6f6761707265666bull : key_[static_cast<size_t>(parent)];
  for (size_t i = 0; i < block_size_; ++i) key = Mix64(key ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 0x9E3779B97F4A7C15ull));
  return key == kNoKey ? 1 : key;
}

bool PrefixCache::Matches(int32_t block, int32_t parent, const int32_t* tokens) const {
  const size_t b = static_cast<size_t>(block);
  return parent_[b] == parent && (parent < 0 || parent_key_[b] == key_[static_cast<size_t>(parent)]) &&
         std::memcmp(tokens_.data() + b * block_size_, tokens, block_size_ * sizeof(int32_t)) == 0;
}

int32_t PrefixCache::Find(int32_t parent, const int32_t* tokens) const {
  if (parent >= 0 && !indexed(parent)) return -1;
  const uint64_t key = KeyOf(parent, tokens);
  for (size_t slot = SlotFor(key);; slot = (slot + 1) & (slots_.size() - 1)) {
    const int32_t block = slots_[slot];
    if (block < 0) return -1;
    if (key_[static_cast<size_t>(block)] == key && Matches(block, parent, tokens)) return block;
  }
}

bool PrefixCache::Register(int32_t block, int32_t parent, const int32_t* tokens) {
  if (indexed(block) || (parent >= 0 && !indexed(parent)) || Find(parent, tokens) >= 0) return false;
  const size_t b = static_cast<size_t>(block);
  const uint64_t key = KeyOf(parent, tokens);
  key_[b] = key;
  parent_[b] = parent;
  parent_key_[b] = parent < 0 ? kNoKey : key_[static_cast<size_t>(parent)];
  std::memcpy(tokens_.data() + b * block_size_, tokens, block_size_ * sizeof(int32_t));
  size_t slot = SlotFor(key);
  while (slots_[slot] >= 0) slot = (slot + 1) & (slots_.size() - 1);
  slots_[slot] = block;
  return true;
}

void PrefixCache::Unindex(int32_t block) {
  const size_t mask = slots_.size() - 1;
  size_t slot = SlotFor(key_[static_cast<size_t>(block)]);
  while (slots_[slot] != block) slot = (slot + 1) & mask;
  // Backward-shift deletion keeps every remaining entry reachable from its home slot.
  size_t hole = slot;
  for (size_t next = (hole + 1) & mask; slots_[next] >= 0; next = (next + 1) & mask) {
    const size_t home = SlotFor(key_[static_cast<size_t>(slots_[next])]);
    // Move the entry into the hole unless its home lies cyclically in (hole, next].
    const bool stays = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
    if (!stays) {
      slots_[hole] = slots_[next];
      hole = next;
    }
  }
  slots_[hole] = -1;
  key_[static_cast<size_t>(block)] = kNoKey;
  parent_[static_cast<size_t>(block)] = -1;
}

void PrefixCache::MakeEvictable(int32_t block) {
  const size_t b = static_cast<size_t>(block);
  if (in_lru_[b]) Unevict(block);
  previous_[b] = newest_;
  next_[b] = -1;
  if (newest_ >= 0) next_[static_cast<size_t>(newest_)] = block;
  newest_ = block;
  if (oldest_ < 0) oldest_ = block;
  in_lru_[b] = 1;
  ++evictable_;
}

void PrefixCache::Unevict(int32_t block) {
  const size_t b = static_cast<size_t>(block);
  if (!in_lru_[b]) return;
  if (previous_[b] >= 0) next_[static_cast<size_t>(previous_[b])] = next_[b]; else oldest_ = next_[b];
  if (next_[b] >= 0) previous_[static_cast<size_t>(next_[b])] = previous_[b]; else newest_ = previous_[b];
  previous_[b] = next_[b] = -1;
  in_lru_[b] = 0;
  --evictable_;
}

int32_t PrefixCache::EvictOldest() {
  const int32_t block = oldest_;
  if (block < 0) return -1;
  Unevict(block);
  Unindex(block);
  return block;
}

}  // namespace oga
