// The text each token id stands for, as the stop-string matcher and the guidance tokenizer need it:
// exact bytes (a byte-level token may hold part of a UTF-8 character), and which ids are special
// (control) tokens with no text. Built once per model from its tokenizer (a loader the Python package
// registers reads tokenizer.json with the `tokenizers` package) or set directly through
// OgaExtModelSetTokenTable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "oga/oga_ext.h"

namespace oga {

class TokenTable {
 public:
  // Copies `table`; throws ApiError when it is malformed.
  explicit TokenTable(const OgaExtTokenTable& table);

  size_t size() const { return special_.size(); }
  // Ids at or beyond size() (padding rows of the model's vocabulary) have no text.
  const char* bytes(int32_t token) const { return bytes_.data() + offsets_[static_cast<size_t>(token)]; }
  size_t length(int32_t token) const {
    const size_t t = static_cast<size_t>(token);
    return t < special_.size() ? offsets_[t + 1] - offsets_[t] : 0;
  }
  bool special(int32_t token) const {
    const size_t t = static_cast<size_t>(token);
    return t >= special_.size() || special_[t] != 0;
  }
  size_t max_length() const { return max_length_; }

 private:
  std::string bytes_;
  std::vector<size_t> offsets_;
  std::vector<uint8_t> special_;
  size_t max_length_ = 0;
};

}  // namespace oga
