#include "config/decoder_names.h"

#include <unordered_set>

#include "base/errors.h"

namespace oga {

namespace {

void RequireLayerTemplate(const std::string& name_template, const char* section, const char* key) {
  if (!IsLayerTemplate(name_template)) {
    throw ApiError(std::string("model.decoder.") + section + "." + key + " template '" + name_template +
                   "' must contain exactly one %d");
  }
}

// The decoder state checks OGA runs when it builds the model, then the paged group's layers.
std::vector<int32_t> PagedLayersForLoading(const ModelConfig& config) {
  const DecoderConfig& decoder = config.decoder;
  const StateGroup* paged = nullptr;
  size_t paged_groups = 0;
  for (const StateGroup& group : decoder.effective_state_groups) {
    if (group.kind == StateGroupKind::kPagedKv) {
      ++paged_groups;
      paged = &group;
    }
  }
  // As 0.18, fixed groups without dynamic batching load; the engine refuses them.
  if (!config.dynamic_batching) return paged_groups == 1 ? paged->layer_ids : std::vector<int32_t>();
  if (paged_groups != 1) throw ApiError("Dynamic batching requires exactly one paged_kv decoder state group");
  if (paged->layer_ids.empty()) throw ApiError("Dynamic batching requires at least one paged_kv decoder layer");
  if (!decoder.state_groups) {
    // An explicit manifest had its templates checked when parsed; the legacy one is checked here.
    RequireLayerTemplate(decoder.inputs.past_key_names, "inputs", "past_key_names");
    RequireLayerTemplate(decoder.inputs.past_value_names, "inputs", "past_value_names");
    RequireLayerTemplate(decoder.outputs.present_key_names, "outputs", "present_key_names");
    RequireLayerTemplate(decoder.outputs.present_value_names, "outputs", "present_value_names");
  }
  if (decoder.sliding_window) {
    const std::unordered_set<int32_t> paged_layers(paged->layer_ids.begin(), paged->layer_ids.end());
    for (const int32_t layer : decoder.sliding_window->layers) {
      if (layer < 0 || layer >= decoder.num_hidden_layers) {
        throw ApiError("Sliding-window layer index is outside the decoder layer range.");
      }
      if (paged_layers.count(layer) == 0) {
        throw ApiError("Every sliding-window layer must belong to the paged_kv decoder state group.");
      }
    }
  }
  return paged->layer_ids;
}

std::vector<const char*> Pointers(const std::vector<std::string>& names) {
  std::vector<const char*> out;
  for (const std::string& name : names) out.push_back(name.c_str());
  return out;
}

size_t Size(int64_t value) { return value > 0 ? static_cast<size_t>(value) : 0; }

}  // namespace

ResolvedDecoderNames::ResolvedDecoderNames(const ModelConfig& config, const std::string& directory,
                                           const std::string& config_json)
    : directory_(directory), config_json_(config_json) {
  const DecoderConfig& decoder = config.decoder;
  paged_layer_ids_ = PagedLayersForLoading(config);
  std::unordered_set<std::string> seen;
  auto expand = [&](const std::string& name_template, std::vector<std::string>& names) {
    for (const int32_t layer : paged_layer_ids_) {
      names.push_back(ExpandLayerTemplate(name_template, layer));
      if (!seen.insert(names.back()).second) {
        throw ApiError("model.decoder resolves more than one paged cache binding to '" + names.back() + "'");
      }
    }
  };
  expand(decoder.inputs.past_key_names, past_keys_);
  expand(decoder.inputs.past_value_names, past_values_);
  expand(decoder.outputs.present_key_names, present_keys_);
  expand(decoder.outputs.present_value_names, present_values_);
  past_key_ptrs_ = Pointers(past_keys_);
  past_value_ptrs_ = Pointers(past_values_);
  present_key_ptrs_ = Pointers(present_keys_);
  present_value_ptrs_ = Pointers(present_values_);
  // Fixed groups: templates and layers were validated when the manifest was parsed.
  for (const StateGroup& group : decoder.effective_state_groups) {
    if (group.kind == StateGroupKind::kPagedKv) continue;
    const bool conv = group.kind == StateGroupKind::kFixedConv;
    const std::string& input = conv ? decoder.inputs.past_conv_names : decoder.inputs.past_recurrent_names;
    const std::string& output = conv ? decoder.outputs.present_conv_names : decoder.outputs.present_recurrent_names;
    for (const int32_t layer : group.layer_ids) {
      fixed_.push_back({conv ? OgaExtStateGroupKind_FixedConv : OgaExtStateGroupKind_FixedRecurrent, layer,
                        ExpandLayerTemplate(input, layer), ExpandLayerTemplate(output, layer)});
    }
  }
  for (const FixedState& state : fixed_)
    fixed_views_.push_back({state.kind, state.layer_id, state.input.c_str(), state.output.c_str()});
  if (decoder.sliding_window) sliding_window_layers_ = decoder.sliding_window->layers;
  session_options_json_ = decoder.session_options_json.empty() ? "{}" : decoder.session_options_json;

  OgaExtDecoderNames& names = names_;
  names.model_directory = directory_.c_str();
  names.config_json = config_json_.c_str();
  names.decoder_filename = decoder.filename.c_str();
  names.input_ids = decoder.inputs.input_ids.c_str();
  names.position_ids = decoder.inputs.position_ids.c_str();
  names.cumulative_sequence_lengths = decoder.inputs.cumulative_sequence_lengths.c_str();
  names.past_sequence_lengths = decoder.inputs.past_sequence_lengths.c_str();
  names.block_table = decoder.inputs.block_table.c_str();
  names.block_table_windowed = decoder.inputs.block_table_windowed.c_str();
  names.attention_metadata = decoder.inputs.attention_metadata.c_str();
  names.attention_mask = decoder.inputs.attention_mask.c_str();
  names.logits_indices = decoder.inputs.logits_indices.c_str();
  names.logits = decoder.outputs.logits.c_str();
  names.num_paged_layers = paged_layer_ids_.size();
  names.paged_layer_ids = paged_layer_ids_.data();
  names.past_key_names = past_key_ptrs_.data();
  names.past_value_names = past_value_ptrs_.data();
  names.present_key_names = present_key_ptrs_.data();
  names.present_value_names = present_value_ptrs_.data();
  names.block_size = config.dynamic_batching ? static_cast<size_t>(config.dynamic_batching->block_size) : 0;
  names.vocab_size = static_cast<size_t>(config.vocab_size);
  names.num_fixed_states = fixed_views_.size();
  names.fixed_states = fixed_views_.empty() ? nullptr : fixed_views_.data();
  names.num_sliding_window_layers = sliding_window_layers_.size();
  names.sliding_window_layers = sliding_window_layers_.empty() ? nullptr : sliding_window_layers_.data();
  names.num_key_value_heads = Size(decoder.num_key_value_heads);
  names.head_size = Size(decoder.head_size);
  names.num_hidden_layers = Size(decoder.num_hidden_layers);
  names.num_blocks = config.dynamic_batching && config.dynamic_batching->num_blocks
                         ? Size(*config.dynamic_batching->num_blocks)
                         : 0;
  names.session_options_json = session_options_json_.c_str();
}

}  // namespace oga
