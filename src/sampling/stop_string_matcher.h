// Decoded stop strings for one turn (0.18's behaviour as observed:
// docs/onnxruntime-genai-0.18-dynamic-engine.md, "Stop strings and guidance").
//
// The matcher decodes the turn's generated tokens with a fresh incremental detokenizer: each token's
// exact bytes (TokenTable), special tokens skipped, incomplete UTF-8 characters held until their
// last byte arrives, and bytes that can never form a character replaced by U+FFFD (one per maximal
// invalid subpart, as Python's "replace" handler and og.TokenizerStream do). Matching is exact
// bytes over that text; for one token the earliest-ending match wins, then the earliest-starting
// (longest), then the lowest index.
//
// It keeps only the last (longest stop string - 1) bytes of text, so a step costs the same however
// long the turn gets. Peek never changes the matcher (the transaction stages its result) and
// Advance never allocates (publication is fail-stop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sampling/token_table.h"

namespace oga {

class StopStringMatcher {
 public:
  // Starts a turn's matcher; an empty list disables it. Allocates everything Advance needs.
  void Reset(const std::vector<std::string>& strings, std::shared_ptr<const TokenTable> table);
  void Clear();
  bool enabled() const { return !strings_.empty(); }

  // The index of the stop string that the text of tokens[count - 1] completes when tokens[0..count)
  // follow the committed text (the earlier ones completing none), or -1. `scratch` receives their
  // decoded bytes (engine-owned, reserved to scratch_capacity(count)).
  int32_t Peek(const int32_t* tokens, size_t count, std::string& scratch) const;
  int32_t Peek(int32_t token, std::string& scratch) const { return Peek(&token, 1, scratch); }
  // Appends `token`'s text.
  void Advance(int32_t token);
  // Capacity `scratch` needs for a Peek of up to `count` tokens to never allocate.
  size_t scratch_capacity(size_t count) const;

 private:
  struct DecoderState {
    uint8_t pending[4] = {};  // bytes of an incomplete UTF-8 character
    uint8_t pending_count = 0;
  };
  // Appends token's decoded bytes to `out` and advances `state`.
  void Decode(int32_t token, DecoderState& state, std::string& out) const;

  std::vector<std::string> strings_;
  size_t longest_ = 0;
  std::shared_ptr<const TokenTable> table_;
  DecoderState state_;
  std::string tail_;  // the last longest_ - 1 bytes of the turn's text
};

}  // namespace oga
