// Prefix caching (engine.dynamic_batching.prefix_caching; 0.18's behaviour as observed:
// docs/onnxruntime-genai-0.18-dynamic-engine.md, "Prefix caching"): full committed blocks are
// indexed by content -- the chain of their tokens from the start of the sequence -- so a newly
// admitted request whose prompt starts with the same tokens adopts those blocks instead of
// recomputing them.
//
// A block's identity is (parent block, its block_size tokens); the parent is the block before it in
// the sequence (-1 for the first), so one lookup per block walks a prompt. Lookups compare the
// parent's id and chain key and the tokens themselves, so a wrong match would need a 64-bit key
// collision on a parent id that was evicted and reused. The index is an open-addressing table sized
// once (no allocation at commit). Blocks are reference counted by the paged cache; an indexed block nobody
// references is evictable, least-recently released first, and stays adoptable until the pool needs
// it. All storage is sized at construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace oga {

class PrefixCache {
 public:
  PrefixCache(size_t num_blocks, size_t block_size);

  // The indexed block holding `tokens` (block_size ids) right after `parent`, or -1.
  int32_t Find(int32_t parent, const int32_t* tokens) const;
  // Indexes a full block. No-op (false) if it is indexed already or an equal block is.
  bool Register(int32_t block, int32_t parent, const int32_t* tokens);
  bool indexed(int32_t block) const { return key_[static_cast<size_t>(block)] != kNoKey; }

  // Evictable blocks: indexed, referenced by nobody.
  void MakeEvictable(int32_t block);  // moves to the most-recent end
  void Unevict(int32_t block);        // adopted again
  bool evictable(int32_t block) const { return in_lru_[static_cast<size_t>(block)] != 0; }
  size_t evictable_count() const { return evictable_; }
  // Removes the least recently released evictable block from the index and returns it (-1 if none).
  int32_t EvictOldest();
 private:
  static constexpr uint64_t kNoKey = 0;
  uint64_t KeyOf(int32_t parent, const int32_t* tokens) const;
  bool Matches(int32_t block, int32_t parent, const int32_t* tokens) const;
  size_t SlotFor(uint64_t key) const { return static_cast<size_t>(key) & (slots_.size() - 1); }
  void Unindex(int32_t block);

  size_t block_size_;
  std::vector<int32_t> slots_;   // open addressing: block ids, -1 = empty
  std::vector<uint64_t> key_;    // per block: its chain key, kNoKey when not indexed
  std::vector<int32_t> parent_;  // per block: the block before it in its sequence
  std::vector<uint64_t> parent_key_;  // per block: that parent's chain key when it was indexed
  std::vector<int32_t> tokens_;  // per block: its block_size tokens
  // Least-recently-released list of evictable blocks (intrusive, doubly linked).
  std::vector<int32_t> previous_, next_;
  std::vector<uint8_t> in_lru_;
  int32_t oldest_ = -1, newest_ = -1;
  size_t evictable_ = 0;
};

}  // namespace oga
