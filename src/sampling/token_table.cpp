#include "sampling/token_table.h"

#include <algorithm>

#include "base/errors.h"

namespace oga {

TokenTable::TokenTable(const OgaExtTokenTable& table) {
  if (table.count > static_cast<size_t>(INT32_MAX)) throw ApiError("The token table has more than INT32_MAX tokens.");
  if (table.count > 0 && table.offsets == nullptr) throw ApiError("The token table has no offsets.");
  if (table.offsets != nullptr && table.offsets[0] != 0) throw ApiError("The token table's offsets[0] must be 0.");
  const size_t total = table.count > 0 ? table.offsets[table.count] : 0;
  if (total > 0 && table.bytes == nullptr) throw ApiError("The token table has offsets but no bytes.");
  offsets_.assign(table.offsets != nullptr ? table.offsets : nullptr,
                  table.offsets != nullptr ? table.offsets + table.count + 1 : nullptr);
  if (offsets_.empty()) offsets_.push_back(0);
  for (size_t i = 0; i < table.count; ++i) {
    if (offsets_[i + 1] < offsets_[i]) {
      throw ApiError("The token table's offsets decrease at token " + std::to_string(i) + ".");
    }
    max_length_ = std::max(max_length_, offsets_[i + 1] - offsets_[i]);
  }
  bytes_.assign(reinterpret_cast<const char*>(table.bytes), total);
  special_.assign(table.count, 0);
  if (table.special != nullptr) {
    for (size_t i = 0; i < table.count; ++i) special_[i] = table.special[i] != 0 ? 1 : 0;
  }
}

}  // namespace oga
