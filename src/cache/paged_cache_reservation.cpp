#include "cache/paged_cache_reservation.h"

#include "base/errors.h"

namespace oga {

PagedCacheReservation::PagedCacheReservation(size_t max_blocks, size_t max_rows) {
  blocks_.reserve(max_blocks);
  begin_.reserve(max_rows + 1);
  table_slots_.reserve(max_rows);
}

void PagedCacheReservation::Begin() {
  if (live_) throw ContractError("a paged-cache reservation is already live");
  blocks_.clear();
  begin_.clear();
  table_slots_.clear();
}

void PagedCacheReservation::BeginRow(int32_t table_slot) {
  table_slots_.push_back(table_slot);
  begin_.push_back(blocks_.size());
}

void PagedCacheReservation::Finish() {
  begin_.push_back(blocks_.size());
  live_ = true;
}

void PagedCacheReservation::Clear() {
  blocks_.clear();
  begin_.clear();
  live_ = false;
}

}  // namespace oga
