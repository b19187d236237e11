#include "varlen_decoder_io.h"

#include <algorithm>

#include "errors.h"
#include "request.h"

namespace oga {

VarlenDecoderIO::VarlenDecoderIO(size_t max_rows, size_t max_tokens, size_t max_columns, size_t ring_blocks)
    : input_ids_(max_tokens),
      position_ids_(max_tokens),
      cumulative_sequence_lengths_(max_rows + 1),
      past_sequence_lengths_(max_rows),
      block_table_(max_rows * max_columns),
      logits_indices_(max_rows),
      ring_blocks_(ring_blocks),
      block_table_windowed_(ring_blocks > 0 ? max_rows * max_columns : 0) {}

const OgaExtStepInputs& VarlenDecoderIO::Pack(const StepPlan& plan, const PagedKeyValueCache& cache) {
  if (plan.rows.size() > past_sequence_lengths_.size() || plan.num_tokens > input_ids_.size() ||
      plan.rows.size() * plan.block_table_columns > block_table_.size()) {
    throw ContractError("the step plan exceeds the packed input buffers");
  }
  size_t max_query = 0;
  size_t max_kv = 0;
  cumulative_sequence_lengths_[0] = 0;
  for (size_t r = 0; r < plan.rows.size(); ++r) {
    const RequestStepPlan& row = plan.rows[r];
    const Request& request = *row.request;
    if (row.token_count == 0 || row.processed_before != request.processed + row.cached_blocks * cache.block_size() ||
        row.token_count > request.tokens.size() - row.processed_before) {
      throw ContractError("a planned token count does not match the request's unprocessed tokens");
    }
    if (row.draft_count > request.draft_tokens.size()) {
      throw ContractError("a planned draft count exceeds the request's proposal");
    }
    const int32_t* tokens = request.tokens.data() + row.processed_before;
    for (size_t j = 0; j < row.token_count; ++j) {
      input_ids_[row.packed_offset + j] = tokens[j];
      position_ids_[row.packed_offset + j] = static_cast<int64_t>(row.processed_before + j);
    }
    // Drafts continue the row: they are verified by the logits of the positions before them.
    for (size_t j = 0; j < row.draft_count; ++j) {
      const size_t at = row.packed_offset + row.token_count + j;
      input_ids_[at] = request.draft_tokens[j];
      position_ids_[at] = static_cast<int64_t>(row.processed_before + row.token_count + j);
    }
    const size_t packed = row.packed_tokens();
    cumulative_sequence_lengths_[r + 1] = static_cast<int32_t>(row.packed_offset + packed);
    past_sequence_lengths_[r] = static_cast<int32_t>(row.processed_before);
    logits_indices_[r] = static_cast<int32_t>(row.logits_index);
    max_query = std::max(max_query, packed);
    max_kv = std::max(max_kv, row.processed_before + packed);
  }
  cache.WriteBlockTable(plan, block_table_.data(), plan.block_table_columns);
  if (ring_blocks_ > 0) {
    for (size_t r = 0; r < plan.rows.size(); ++r) {
      const int32_t table = cache.TableSlot(r);
      if (table < 0) throw ContractError("a planned row has no block table for its sliding-window ring");
      const size_t base = static_cast<size_t>(table) * ring_blocks_;
      int32_t* row_out = block_table_windowed_.data() + r * plan.block_table_columns;
      for (size_t j = 0; j < plan.block_table_columns; ++j) row_out[j] = static_cast<int32_t>(base + j % ring_blocks_);
    }
  }
  // Eager steps report exact bounds: the lower bound equals the upper bound.
  attention_metadata_[0] = static_cast<int32_t>(max_query);
  attention_metadata_[1] = static_cast<int32_t>(max_kv);
  attention_metadata_[2] = static_cast<int32_t>(max_kv);

  inputs_.num_rows = plan.rows.size();
  inputs_.num_tokens = plan.num_tokens;
  inputs_.input_ids = input_ids_.data();
  inputs_.position_ids = position_ids_.data();
  inputs_.cumulative_sequence_lengths = cumulative_sequence_lengths_.data();
  inputs_.past_sequence_lengths = past_sequence_lengths_.data();
  inputs_.block_table = block_table_.data();
  inputs_.block_table_columns = plan.block_table_columns;
  inputs_.attention_metadata = attention_metadata_;
  inputs_.logits_indices = logits_indices_.data();
  inputs_.graph_eligible = plan.graph_eligible ? 1 : 0;
  inputs_.block_table_windowed = ring_blocks_ > 0 ? block_table_windowed_.data() : nullptr;
  return inputs_;
}

}  // namespace oga
