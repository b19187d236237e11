// Typed view of genai_config.json: the parts the engine core reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace oga {
namespace json {
class Value;
}

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
  // Beam-search and cache-layout settings: stored so GeneratorParams reports them (beam search is
  // refused by the Generator, the rest has no effect on one beam).
  int64_t num_return_sequences = 1;
  double length_penalty = 1.0;
  double diversity_penalty = 0.0;
  bool early_stopping = true;
  bool past_present_share_buffer = true;
};

// engine.dynamic_batching.
struct DynamicBatchingConfig {
  int64_t block_size = 256;
  std::optional<int64_t> num_blocks;
  std::optional<double> gpu_utilization_factor;
  int64_t max_batch_size = 16;
  int64_t max_scheduled_tokens = 2048;
  // As written; unset means on (onnxruntime-genai 0.18 caches prefixes unless the key says false,
  // observed side by side in tests/conformance: docs/onnxruntime-genai-0.18-dynamic-engine.md,
  // "Prefix caching"), except for models with a sliding-window ring, which prefix caching does not
  // support yet.
  std::optional<bool> prefix_caching;
  // What a step does when nothing schedulable fits the free blocks or residency slots (oga only;
  // 0.18 has no preemption): Recompute releases the KV cache of the most recently admitted running
  // request (then of turn-complete residents) and prefills its committed tokens again later; None
  // keeps 0.18's behaviour, a CapacityBlocked event for the caller to resolve.
  enum class Preemption { Recompute, None };
  Preemption preemption = Preemption::Recompute;
};

// model.decoder.inputs: graph input names (keys and defaults of OGA 0.18). `%d` in a template
// stands for the logical layer id.
struct DecoderInputNames {
  std::string input_ids = "input_ids";
  std::string position_ids = "position_ids";
  std::string cumulative_sequence_lengths = "cumulative_sequence_lengths";
  std::string past_sequence_lengths = "past_sequence_lengths";
  std::string block_table = "block_table";
  std::string block_table_windowed = "block_table_windowed";
  std::string attention_metadata = "attention_metadata";
  std::string attention_mask = "attention_mask";  // static (contiguous-cache) decoders
  std::string logits_indices;  // "" = the graph has none
  std::string past_key_names = "past_key_values.%d.key";
  std::string past_value_names = "past_key_values.%d.value";
  std::string past_key_scale_names;    // "" = none
  std::string past_value_scale_names;  // "" = none
  std::string past_conv_names = "past_key_values.%d.conv_state";
  std::string past_recurrent_names = "past_key_values.%d.recurrent_state";
  std::string state_update_capture_count = "state_update_capture_count";
  std::string state_update_active = "state_update_active";
};

// model.decoder.outputs.
struct DecoderOutputNames {
  std::string logits = "logits";
  std::string present_key_names = "present.%d.key";
  std::string present_value_names = "present.%d.value";
  std::string present_key_scale_names;    // "" = none
  std::string present_value_scale_names;  // "" = none
  std::string present_conv_names = "present.%d.conv_state";
  std::string present_recurrent_names = "present.%d.recurrent_state";
  std::string state_update_conv_value_names = "state_update.%d.conv_value";
  std::string state_update_recurrent_capsule_names = "state_update.%d.recurrent_capsule";
};

// model.decoder.sliding_window. Keys beyond window_size and layers are kept only in `json`.
struct SlidingWindowConfig {
  int64_t window_size = 0;
  std::vector<int32_t> layers;
  std::string json;  // the whole object, compact
};

enum class StateGroupKind { kPagedKv, kFixedConv, kFixedRecurrent };

// "paged_kv", "fixed_conv", "fixed_recurrent".
const char* StateGroupKindName(StateGroupKind kind);

// One entry of model.decoder.state_groups.
struct StateGroup {
  StateGroupKind kind = StateGroupKind::kPagedKv;
  std::vector<int32_t> layer_ids;  // as written (validated: in range, no duplicates, non-empty)
  std::string state_update_json;   // "" when absent; fixed groups only
};

struct DecoderConfig {
  std::string filename = "model.onnx";
  int64_t head_size = 0;  // 0 = absent, as for the other sizes
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_key_value_heads = 0;
  std::string session_options_json;  // "" when absent; any object content is accepted
  std::optional<SlidingWindowConfig> sliding_window;
  DecoderInputNames inputs;
  DecoderOutputNames outputs;
  // model.decoder.layer_types as written (OGA's builder writes it for LFM2: "conv",
  // "full_attention", ...); read only when there is no explicit manifest. Empty when absent.
  std::vector<std::string> layer_types;
  // The explicit manifest; nullopt = absent (legacy dense paged KV over 0..num_hidden_layers-1, or
  // the groups layer_types implies).
  std::optional<std::vector<StateGroup>> state_groups;
  // The state groups the decoder runs with, resolved once when the configuration is parsed: the
  // explicit manifest; else, with layer_types, its attention layers as the paged_kv group and its
  // conv layers as a fixed_conv group; else the legacy dense paged_kv group over
  // 0..num_hidden_layers-1.
  std::vector<StateGroup> effective_state_groups;
};

struct ModelConfig {
  // model.*
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  std::vector<int32_t> eos_token_ids;  // eos_token_id may be an int or a list
  int32_t bos_token_id = 0;
  int32_t pad_token_id = 0;
  DecoderConfig decoder;
  SearchConfig search;
  // engine.*: dynamic batching is selected iff present with at least one recognised key.
  std::optional<DynamicBatchingConfig> dynamic_batching;
  int64_t static_max_batch_size = 4;
  // engine.shared_generators (oga): every Generator of the model runs on one shared engine
  // (generator_host.h) instead of an engine of its own.
  bool shared_generators = false;
  // Test-model extras ("test_model" object), ignored by real models.
  bool test_per_token_logits = false;
  int64_t test_max_block_table_columns = 0;
  bool test_windowed_block_table = false;  // the test executor checks the sliding-window ring
  int64_t test_fixed_state_row_words = 2;  // 8-byte words per fixed-state row (hybrid test models)
  bool test_fixed_state_capture = false;   // the test executor captures every token's fixed state
  bool test_cuda_graph = false;            // the test executor declares (and checks) CUDA graph steps
  bool test_device_ops = false;            // engine-owned state on a simulated device
  bool test_device_logits = false;         // logits on the simulated device (needs test_device_ops)
  bool test_device_sampling = true;        // the simulated device selects tokens (OgaExtDeviceOps.sample)
};

// Parses a genai_config.json document. Throws json::Error (a std::runtime_error) whose message
// starts with "JSON Error: " and ends with " at line L index I" for syntax errors, unknown keys
// and invalid values (the OGA 0.18 message shape); whole-config checks (vocabulary, state-group
// manifest) throw std::runtime_error with OGA's unpositioned texts.
ModelConfig ParseModelConfig(const std::string& json_text);
// The same for an already parsed (possibly merged) document.
ModelConfig ParseModelConfig(const json::Value& root);

// Expands a name template for one logical layer (its single %d replaced by the id). Templates
// are checked for exactly one %d when parsed (explicit manifests) or before expansion (legacy).
std::string ExpandLayerTemplate(const std::string& name_template, int32_t layer_id);
// True when `name_template` contains exactly one "%d" and no other '%' conversion.
bool IsLayerTemplate(const std::string& name_template);

}  // namespace oga
