#include "sampling/stop_string_matcher.h"

#include <algorithm>
#include <utility>

namespace oga {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Continuation bytes a UTF-8 sequence needs after `lead`, or -1 when `lead` cannot start one.
int Needed(uint8_t lead) {
  if (lead < 0x80) return 0;
  if (lead >= 0xC2 && lead <= 0xDF) return 1;
  if (lead >= 0xE0 && lead <= 0xEF) return 2;
  if (lead >= 0xF0 && lead <= 0xF4) return 3;
  return -1;
}

// Whether `byte` may follow the bytes already pending (RFC 3629: no overlongs, no surrogates,
// nothing above U+10FFFF).
bool Continues(const uint8_t* pending, uint8_t count, uint8_t byte) {
  uint8_t low = 0x80, high = 0xBF;
  if (count == 1) {
    switch (pending[0]) {
      case 0xE0: low = 0xA0; break;
      case 0xED: high = 0x9F; break;
      case 0xF0: low = 0x90; break;
      case 0xF4: high = 0x8F; break;
      default: break;
    }
  }
  return byte >= low && byte <= high;
}

}  // namespace

void StopStringMatcher::Reset(const std::vector<std::string>& strings, std::shared_ptr<const TokenTable> table) {
  Clear();
  if (strings.empty()) return;
  std::vector<std::string> copy = strings;
  size_t longest = 0;
  for (const std::string& s : copy) longest = std::max(longest, s.size());
  std::string tail;
  // Advance appends one token's text before trimming: at most 3 bytes of replacement per byte.
  tail.reserve(longest + 3 * (table->max_length() + 4));
  strings_ = std::move(copy);
  longest_ = longest;
  table_ = std::move(table);
  tail_ = std::move(tail);
}

void StopStringMatcher::Clear() {
  strings_.clear();
  longest_ = 0;
  table_.reset();
  state_ = DecoderState{};
  tail_.clear();
}

size_t StopStringMatcher::scratch_capacity(size_t count) const {
  return table_ ? count * 3 * (table_->max_length() + 4) : 0;
}

void StopStringMatcher::Decode(int32_t token, DecoderState& state, std::string& out) const {
  if (table_->special(token)) return;
  // Each token reads as in the middle of a text: like 0.18's detokenizer, a SentencePiece
  // decoder's drop of a text's first space is not applied at the start of a turn.
  auto emit = [&](const char* bytes, size_t count) { out.append(bytes, count); };
  const char* bytes = table_->bytes(token);
  const size_t length = table_->length(token);
  for (size_t i = 0; i < length;) {
    const uint8_t byte = static_cast<uint8_t>(bytes[i]);
    if (state.pending_count == 0) {
      const int needed = Needed(byte);
      if (needed == 0) {
        emit(bytes + i, 1);
      } else if (needed < 0) {
        emit(kReplacement, 3);
      } else {
        state.pending[state.pending_count++] = byte;
      }
      ++i;
      continue;
    }
    if (!Continues(state.pending, state.pending_count, byte)) {
      // The pending prefix can never complete: one replacement, then `byte` starts afresh.
      state.pending_count = 0;
      emit(kReplacement, 3);
      continue;
    }
    state.pending[state.pending_count++] = byte;
    if (state.pending_count == 1 + Needed(state.pending[0])) {
      emit(reinterpret_cast<const char*>(state.pending), state.pending_count);
      state.pending_count = 0;
    }
    ++i;
  }
}

int32_t StopStringMatcher::Peek(const int32_t* tokens, size_t count, std::string& scratch) const {
  scratch.clear();
  DecoderState state = state_;
  for (size_t i = 0; i + 1 < count; ++i) Decode(tokens[i], state, scratch);
  const size_t earlier = scratch.size();
  Decode(tokens[count - 1], state, scratch);
  if (scratch.size() == earlier) return -1;
  const size_t committed = tail_.size();
  const size_t before = committed + earlier;
  const size_t total = committed + scratch.size();
  auto at = [&](size_t i) { return i < committed ? tail_[i] : scratch[i - committed]; };
  // Every match ending inside the new text; the earliest end wins, then the longest, then the
  // lowest index.
  for (size_t end = before + 1; end <= total; ++end) {
    int32_t best = -1;
    for (size_t index = 0; index < strings_.size(); ++index) {
      const std::string& s = strings_[index];
      if (s.size() > end) continue;
      if (best >= 0 && s.size() <= strings_[static_cast<size_t>(best)].size()) continue;
      const size_t start = end - s.size();
      bool equal = true;
      for (size_t k = 0; k < s.size() && equal; ++k) equal = at(start + k) == s[k];
      if (equal) best = static_cast<int32_t>(index);
    }
    if (best >= 0) return best;
  }
  return -1;
}

void StopStringMatcher::Advance(int32_t token) {
  Decode(token, state_, tail_);  // capacity reserved by Reset
  const size_t keep = longest_ - 1;
  if (tail_.size() > keep) tail_.erase(0, tail_.size() - keep);
}

}  // namespace oga
