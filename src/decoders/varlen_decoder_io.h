// VarlenDecoderIO: packs a step plan into the variable-length decoder inputs (no padding between
// requests) in buffers allocated once at the configured limits.
//
//   input_ids                    every row's unprocessed tokens, concatenated in plan order
//   position_ids                 past_sequence_lengths[r] + j for the row's j-th token
//   cumulative_sequence_lengths  [0, q0, q0+q1, ...]
//   past_sequence_lengths        committed KV length of each row (its first write position)
//   block_table                  committed + reserved blocks per row, -1 padded
//   attention_metadata           [max query length, max KV length, KV lower bound] (eager: exact)
//   logits_indices               packed row of each request's last token
//   block_table_windowed         sliding-window ring: entry j = the row's ring block j mod R
//                                (ring blocks are fixed per block table: table t owns [t*R, t*R + R))
//
// CUDA graphs (seed "CUDA graph capture"): with graph capture on, a pure-decode step is packed at
// a graph bucket -- block-table columns rounded up to a power of two of at least kMinGraphColumns,
// capped at the configured maximum -- with attention bounds valid for every replay of that bucket,
// and gets the graph identity of (rows, bucket); every other step runs eagerly (graph id -1) with
// exact bounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "oga/oga_ext.h"
#include "cache/paged_cache.h"
#include "plan/step_plan.h"

namespace oga {

constexpr size_t kMinGraphColumns = 8;

class VarlenDecoderIO {
 public:
  // `ring_blocks` R > 0 gives every row a sliding-window ring of R blocks; 0 = no ring.
  // `graph_capture`: pack pure-decode steps for CUDA graphs (see above).
  VarlenDecoderIO(size_t max_rows, size_t max_tokens, size_t max_columns, size_t ring_blocks = 0,
                  bool graph_capture = false);

  // The graph bucket of a step `columns` wide: a power of two >= kMinGraphColumns, at most the
  // configured maximum.
  size_t GraphColumns(size_t columns) const;
  // 0 for the smallest bucket, 1 for the next, ...
  size_t GraphBucketIndex(size_t bucket) const;

  // Fills the buffers for `plan` and returns the view the executor receives.
  const OgaExtStepInputs& Pack(const StepPlan& plan, const PagedKeyValueCache& cache);
  const OgaExtStepInputs& inputs() const { return inputs_; }

 private:
  std::vector<int64_t> input_ids_;
  std::vector<int64_t> position_ids_;
  std::vector<int32_t> cumulative_sequence_lengths_;
  std::vector<int32_t> past_sequence_lengths_;
  std::vector<int32_t> block_table_;
  std::vector<int32_t> logits_indices_;
  size_t ring_blocks_;
  std::vector<int32_t> block_table_windowed_;
  size_t max_columns_;
  bool graph_capture_;
  size_t graph_buckets_ = 0;  // distinct bucket widths up to max_columns
  int32_t attention_metadata_[3] = {0, 0, 0};
  OgaExtStepInputs inputs_{};
};

}  // namespace oga
