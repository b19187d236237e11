// Typed view of genai_config.json: the parts the engine core reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oga {

// model.search: defaults for every request and turn.
struct SearchConfig {
  int64_t max_length = 0;  // 0 = absent (then context_length)
  int64_t min_length = 0;
  int64_t num_beams = 1;
  int64_t batch_size = 1;
  bool do_sample = false;
  int64_t top_k = 50;
  double top_p = 1.0;
  double temperature = 1.0;
  double repetition_penalty = 1.0;
  int64_t no_repeat_ngram_size = 0;
  std::optional<uint64_t> random_seed;  // request seed basis
  int64_t chunk_size = 0;               // 0 = absent: prefill chunked only by the step budget
};

// engine.dynamic_batching.
struct DynamicBatchingConfig {
  int64_t block_size = 256;
  std::optional<int64_t> num_blocks;
  std::optional<double> gpu_utilization_factor;
  int64_t max_batch_size = 16;
  int64_t max_scheduled_tokens = 2048;
  bool prefix_caching = false;
};

struct ModelConfig {
  // model.*
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  std::vector<int32_t> eos_token_ids;  // eos_token_id may be an int or a list
  int32_t bos_token_id = 0;
  int32_t pad_token_id = 0;
  SearchConfig search;
  // engine.*: dynamic batching is selected iff present with at least one recognised key.
  std::optional<DynamicBatchingConfig> dynamic_batching;
  int64_t static_max_batch_size = 4;
  // Test-model extras ("test_model" object), ignored by real models.
  bool test_per_token_logits = false;
  int64_t test_max_block_table_columns = 0;
};

// Parses a genai_config.json document. Throws std::runtime_error whose message starts with
// "JSON Error: " and ends with " at line L index I" for syntax errors, unknown keys and invalid
// values (the OGA 0.18 message shape).
ModelConfig ParseModelConfig(const std::string& json_text);

}  // namespace oga
