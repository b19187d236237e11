#include "decoders/varlen_decoder_io.h"

#include <algorithm>
#include <cstdint>

#include "base/errors.h"
#include "request/request.h"

namespace oga {

namespace {

size_t NextPowerOfTwo(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

VarlenDecoderIO::VarlenDecoderIO(size_t max_rows, size_t max_tokens, size_t max_columns, size_t ring_blocks,
                                 bool graph_capture)
    : input_ids_(max_tokens),
      position_ids_(max_tokens),
      cumulative_sequence_lengths_(max_rows + 1),
      past_sequence_lengths_(max_rows),
      block_table_(max_rows * max_columns),
      logits_indices_(max_rows),
      ring_blocks_(ring_blocks),
      block_table_windowed_(ring_blocks > 0 ? max_rows * max_columns : 0),
      max_columns_(max_columns),
      graph_capture_(graph_capture) {
  graph_buckets_ = max_columns_ > 0 ? GraphBucketIndex(GraphColumns(max_columns_)) + 1 : 0;
}

size_t VarlenDecoderIO::GraphBucketIndex(size_t bucket) const {
  size_t index = 0;
  for (size_t width = GraphColumns(1); width < bucket; width = GraphColumns(width + 1)) ++index;
  return index;
}

size_t VarlenDecoderIO::GraphColumns(size_t columns) const {
  return std::min(std::max(NextPowerOfTwo(columns), kMinGraphColumns), max_columns_);
}

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
  // A graph step is packed at its bucket's width, so one captured graph serves every step of it.
  // A graph's bounds hold for every replay only while each decode row owns exactly the blocks its
  // KV needs (a captured graph keeps the bounds it was captured with); a step where some row owns
  // more runs eagerly.
  bool graph = graph_capture_ && plan.graph_eligible;
  for (size_t r = 0; graph && r < plan.rows.size(); ++r) {
    graph = plan.rows[r].blocks_after == cache.BlocksFor(plan.rows[r].processed_before + 1);
  }
  const size_t columns = graph ? GraphColumns(plan.block_table_columns) : plan.block_table_columns;
  if (columns < plan.block_table_columns) throw ContractError("a graph step is wider than its graph bucket");
  cache.WriteBlockTable(plan, block_table_.data(), columns);
  if (ring_blocks_ > 0) {
    for (size_t r = 0; r < plan.rows.size(); ++r) {
      const int32_t table = cache.TableSlot(r);
      if (table < 0) throw ContractError("a planned row has no block table for its sliding-window ring");
      const size_t base = static_cast<size_t>(table) * ring_blocks_;
      int32_t* row_out = block_table_windowed_.data() + r * columns;
      for (size_t j = 0; j < columns; ++j) row_out[j] = static_cast<int32_t>(base + j % ring_blocks_);
    }
  }
  if (graph) {
    // Bounds valid for every replay of the bucket: one query token; at most the bucket's slots; more
    // than the preceding bucket's slots, because the widest row owns exactly the blocks its KV needs
    // (the smallest bucket only bounds it by 1).
    const size_t block_size = cache.block_size();
    size_t preceding = 0;  // the largest power of two below the bucket, if that is a smaller bucket
    if (columns > kMinGraphColumns) {
      preceding = kMinGraphColumns;
      while (preceding * 2 < columns) preceding *= 2;
    }
    if (static_cast<uint64_t>(columns) * block_size > static_cast<uint64_t>(INT32_MAX)) {
      throw ContractError("a graph bucket's KV bound does not fit in int32");
    }
    attention_metadata_[0] = 1;
    attention_metadata_[1] = static_cast<int32_t>(columns * block_size);
    attention_metadata_[2] = preceding > 0 ? static_cast<int32_t>(preceding * block_size + 1) : 1;
    if (max_kv > static_cast<size_t>(attention_metadata_[1]) || max_kv < static_cast<size_t>(attention_metadata_[2])) {
      throw ContractError("a graph step's KV length is outside its bucket's bounds");
    }
    // One graph per (rows, bucket).
    inputs_.graph_id = static_cast<int64_t>((plan.rows.size() - 1) * graph_buckets_ + GraphBucketIndex(columns));
  } else {
    // Eager steps report exact bounds: the lower bound equals the upper bound.
    attention_metadata_[0] = static_cast<int32_t>(max_query);
    attention_metadata_[1] = static_cast<int32_t>(max_kv);
    attention_metadata_[2] = static_cast<int32_t>(max_kv);
    inputs_.graph_id = -1;
  }

  inputs_.num_rows = plan.rows.size();
  inputs_.num_tokens = plan.num_tokens;
  inputs_.input_ids = input_ids_.data();
  inputs_.position_ids = position_ids_.data();
  inputs_.cumulative_sequence_lengths = cumulative_sequence_lengths_.data();
  inputs_.past_sequence_lengths = past_sequence_lengths_.data();
  inputs_.block_table = block_table_.data();
  inputs_.block_table_columns = columns;
  inputs_.attention_metadata = attention_metadata_;
  inputs_.logits_indices = logits_indices_.data();
  inputs_.graph_eligible = plan.graph_eligible ? 1 : 0;
  inputs_.block_table_windowed = ring_blocks_ > 0 ? block_table_windowed_.data() : nullptr;
  return inputs_;
}

}  // namespace oga
