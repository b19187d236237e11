// genai_config.json -> oga::ModelConfig.
//
// The document is parsed into a DOM first and then walked section by section in document order,
// so the first error reported is the one OGA 0.18 (a streaming parser) would hit first.
//
// Error positions follow OGA, not the value's first byte: OGA reports wherever its parser cursor
// stood when the config code rejected a value, which is just past a scalar, or just past the
// opening bracket of an object or array (the config code sees a container as soon as it opens).
// Pinned by the observed 0.18 texts "JSON Error: max_scheduled_tokens must be > 0 at line 1 index
// 58" for {"engine": {"dynamic_batching": {"max_scheduled_tokens": 0}}} and "... Unknown value
// \"foo\" at line 1 index 41" for {"engine": {"dynamic_batching": {"foo": 1}}}.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/json.h"
#include "config/model_config.h"

namespace oga {
namespace {

using json::Member;
using json::Position;
using json::Value;

// OGA's static_batching.max_batch_size default, restored when a later dynamic_batching section
// replaces a static one.
constexpr int64_t kDefaultStaticMaxBatchSize = 4;

Position OgaCursorAfter(const Value& value) {
  if (value.is_object() || value.is_array()) {
    Position after_bracket = value.start();
    ++after_bracket.column;
    return after_bracket;
  }
  return value.end();
}

[[noreturn]] void FailAt(const Value& value, const std::string& what) {
  json::ThrowError(what, OgaCursorAfter(value));
}

// `section_path` is OGA's "outer:inner" naming of the enclosing objects, e.g.
// "engine:dynamic_batching".
[[noreturn]] void FailUnknownKey(std::string_view section_path, const Member& member) {
  FailAt(member.value, std::string(section_path) + ": Unknown value \"" + member.key + "\"");
}

// ---- typed readers: `name` is the key as the user wrote it, used in the message ----

const Value& RequireObject(const Value& value, std::string_view name) {
  if (!value.is_object()) FailAt(value, std::string(name) + " must be an object");
  return value;
}

bool ReadBool(const Value& value, std::string_view name) {
  if (!value.is_bool()) FailAt(value, std::string(name) + " must be a boolean");
  return value.bool_value();
}

double ReadNumber(const Value& value, std::string_view name) {
  if (!value.is_number()) FailAt(value, std::string(name) + " must be a number");
  return value.double_value();
}

std::string ReadString(const Value& value, std::string_view name) {
  if (!value.is_string()) FailAt(value, std::string(name) + " must be a string");
  return value.string_value();
}

// Accepts any number whose value is whole (2, 2.0, 2e3), as OGA does: it reads every number as a
// double and converts. Fractions are rejected instead of OGA's silent truncation.
int64_t ReadInt(const Value& value, std::string_view name) {
  if (!value.is_number()) FailAt(value, std::string(name) + " must be an integer");
  if (value.is_integral()) return value.int_value();
  const double number = value.double_value();
  if (std::trunc(number) != number) FailAt(value, std::string(name) + " must be an integer");
  // 2^63 is exact as a double; the int64 range is [-2^63, 2^63).
  constexpr double kTwoPow63 = 9223372036854775808.0;
  if (number < -kTwoPow63 || number >= kTwoPow63) {
    FailAt(value, std::string(name) + " is out of range");
  }
  return static_cast<int64_t>(number);
}

int32_t ReadInt32(const Value& value, std::string_view name) {
  const int64_t number = ReadInt(value, name);
  if (number < std::numeric_limits<int32_t>::min() ||
      number > std::numeric_limits<int32_t>::max()) {
    FailAt(value, std::string(name) + " is out of range");
  }
  return static_cast<int32_t>(number);
}

int64_t ReadPositiveInt(const Value& value, std::string_view name) {
  const int64_t number = ReadInt(value, name);
  if (number <= 0) FailAt(value, std::string(name) + " must be > 0");
  return number;
}

int64_t ReadNonNegativeInt(const Value& value, std::string_view name) {
  const int64_t number = ReadInt(value, name);
  if (number < 0) FailAt(value, std::string(name) + " must be >= 0");
  return number;
}

// ---- model.decoder ----

template <typename Names>
struct NameKey {
  const char* key;
  std::string Names::*field;
};

const NameKey<DecoderInputNames> kInputNameKeys[] = {
    {"input_ids", &DecoderInputNames::input_ids},
    {"position_ids", &DecoderInputNames::position_ids},
    {"cumulative_sequence_lengths", &DecoderInputNames::cumulative_sequence_lengths},
    {"past_sequence_lengths", &DecoderInputNames::past_sequence_lengths},
    {"block_table", &DecoderInputNames::block_table},
    {"block_table_windowed", &DecoderInputNames::block_table_windowed},
    {"attention_metadata", &DecoderInputNames::attention_metadata},
    {"attention_mask", &DecoderInputNames::attention_mask},
    {"logits_indices", &DecoderInputNames::logits_indices},
    {"past_key_names", &DecoderInputNames::past_key_names},
    {"past_value_names", &DecoderInputNames::past_value_names},
    {"past_key_scale_names", &DecoderInputNames::past_key_scale_names},
    {"past_value_scale_names", &DecoderInputNames::past_value_scale_names},
    {"past_conv_names", &DecoderInputNames::past_conv_names},
    {"past_recurrent_names", &DecoderInputNames::past_recurrent_names},
    {"state_update_capture_count", &DecoderInputNames::state_update_capture_count},
    {"state_update_active", &DecoderInputNames::state_update_active},
};

const NameKey<DecoderOutputNames> kOutputNameKeys[] = {
    {"logits", &DecoderOutputNames::logits},
    {"present_key_names", &DecoderOutputNames::present_key_names},
    {"present_value_names", &DecoderOutputNames::present_value_names},
    {"present_key_scale_names", &DecoderOutputNames::present_key_scale_names},
    {"present_value_scale_names", &DecoderOutputNames::present_value_scale_names},
    {"present_conv_names", &DecoderOutputNames::present_conv_names},
    {"present_recurrent_names", &DecoderOutputNames::present_recurrent_names},
    {"state_update_conv_value_names", &DecoderOutputNames::state_update_conv_value_names},
    {"state_update_recurrent_capsule_names", &DecoderOutputNames::state_update_recurrent_capsule_names},
};

// Other keys (attention_mask, past_key_values_length, encoder names, ...) belong to decoders
// outside the paged contract; they are accepted and ignored.
template <typename Names, size_t N>
void ParseNameMap(const Value& section, const NameKey<Names> (&keys)[N], Names& names) {
  for (const Member& member : section.members()) {
    for (const NameKey<Names>& name_key : keys) {
      if (member.key == name_key.key) {
        names.*(name_key.field) = ReadString(member.value, member.key);
        break;
      }
    }
  }
}

std::vector<int32_t> ReadLayerIds(const Value& value, std::string_view name) {
  if (!value.is_array()) FailAt(value, std::string(name) + " must be a list of integers");
  std::vector<int32_t> ids;
  ids.reserve(value.elements().size());
  for (const Value& element : value.elements()) ids.push_back(ReadInt32(element, name));
  return ids;
}

SlidingWindowConfig ParseSlidingWindow(const Value& section) {
  SlidingWindowConfig window;
  for (const Member& member : section.members()) {
    if (member.key == "window_size") {
      window.window_size = ReadPositiveInt(member.value, member.key);
    } else if (member.key == "layers") {
      window.layers = ReadLayerIds(member.value, member.key);
    }
    // slide_key_value_cache, alignment, cache_slack, ...: kept in `json` for the executor.
  }
  window.json = json::Serialize(section);
  return window;
}

constexpr int64_t kMaxHiddenLayers = 1 << 20;

constexpr const char* kStateGroupsPath = "model:decoder:state_groups";

// A group as written; `kind` stays empty when the entry names none (reported after parsing, as
// OGA does, with the group's index).
struct ParsedStateGroup {
  std::optional<StateGroupKind> kind;
  std::vector<int32_t> layer_ids;
  std::optional<std::string> state_update_json;
};

StateGroupKind ReadStateGroupKind(const Value& value) {
  if (!value.is_string()) FailAt(value, "kind must be a string");
  const std::string& kind = value.string_value();
  if (kind == "paged_kv") return StateGroupKind::kPagedKv;
  if (kind == "fixed_conv") return StateGroupKind::kFixedConv;
  if (kind == "fixed_recurrent") return StateGroupKind::kFixedRecurrent;
  if (kind == "fixed") {
    FailAt(value, std::string(kStateGroupsPath) +
                      ":kind:Decoder state group kind 'fixed' is no longer supported; use 'fixed_conv' or "
                      "'fixed_recurrent' and move binding templates to model.decoder.inputs and "
                      "model.decoder.outputs");
  }
  FailAt(value, std::string(kStateGroupsPath) + ":kind:Unsupported decoder state group kind '" + kind + "'");
}

ParsedStateGroup ParseStateGroup(const Value& entry) {
  if (!entry.is_object()) FailAt(entry, "state_groups entries must be objects");
  ParsedStateGroup group;
  for (const Member& member : entry.members()) {
    const Value& value = member.value;
    if (member.key == "kind") {
      group.kind = ReadStateGroupKind(value);
    } else if (member.key == "layer_ids") {
      group.layer_ids = ReadLayerIds(value, member.key);
    } else if (member.key == "state_update") {
      group.state_update_json = json::Serialize(RequireObject(value, member.key));
    } else if (member.key == "bindings") {
      FailAt(value, std::string(kStateGroupsPath) +
                        ":bindings:Legacy decoder state group bindings are no longer supported; move binding "
                        "templates to model.decoder.inputs and model.decoder.outputs");
    } else {
      FailUnknownKey(kStateGroupsPath, member);
    }
  }
  return group;
}

std::vector<ParsedStateGroup> ParseStateGroups(const Value& value) {
  if (!value.is_array()) FailAt(value, "state_groups must be a list");
  std::vector<ParsedStateGroup> groups;
  groups.reserve(value.elements().size());
  for (const Value& entry : value.elements()) groups.push_back(ParseStateGroup(entry));
  return groups;
}

// The binding templates a group kind uses: {binding name, input template, output template}.
struct GroupBinding {
  const char* name;
  const std::string* input_template;
  const std::string* output_template;
};

std::vector<GroupBinding> BindingsOf(StateGroupKind kind, const DecoderConfig& decoder) {
  switch (kind) {
    case StateGroupKind::kPagedKv:
      return {{"key", &decoder.inputs.past_key_names, &decoder.outputs.present_key_names},
              {"value", &decoder.inputs.past_value_names, &decoder.outputs.present_value_names}};
    case StateGroupKind::kFixedConv:
      return {{"state", &decoder.inputs.past_conv_names, &decoder.outputs.present_conv_names}};
    case StateGroupKind::kFixedRecurrent:
      return {{"state", &decoder.inputs.past_recurrent_names, &decoder.outputs.present_recurrent_names}};
  }
  return {};
}

// OGA 0.18's manifest checks, with its texts (unpositioned: they run after parsing).
std::vector<StateGroup> ValidateStateGroups(const std::vector<ParsedStateGroup>& parsed, const DecoderConfig& decoder) {
  if (parsed.empty()) throw std::runtime_error("model.decoder.state_groups must not be empty");
  std::vector<StateGroup> groups;
  groups.reserve(parsed.size());
  std::unordered_set<int32_t> paged_layers;
  std::unordered_set<std::string> resolved_names;
  bool any_state_update = false;
  bool any_fixed_without_state_update = false;
  for (size_t index = 0; index < parsed.size(); ++index) {
    const ParsedStateGroup& entry = parsed[index];
    const std::string prefix = "model.decoder.state_groups[" + std::to_string(index) + "] (";
    if (!entry.kind) throw std::runtime_error(prefix + "invalid) is missing kind");
    const StateGroupKind kind = *entry.kind;
    const std::string where = prefix + StateGroupKindName(kind) + ")";
    const bool fixed = kind != StateGroupKind::kPagedKv;
    if (entry.state_update_json && !fixed) {
      throw std::runtime_error(where + " only fixed state groups support state_update");
    }
    if (fixed) {
      (entry.state_update_json ? any_state_update : any_fixed_without_state_update) = true;
    }
    if (entry.layer_ids.empty()) throw std::runtime_error(where + " must contain at least one layer_id");
    std::unordered_set<int32_t> seen;
    for (const int32_t layer_id : entry.layer_ids) {
      if (layer_id < 0 || layer_id >= decoder.num_hidden_layers) {
        throw std::runtime_error(where + " has layer_id " + std::to_string(layer_id) +
                                 " outside [0, num_hidden_layers)");
      }
      if (!seen.insert(layer_id).second) {
        throw std::runtime_error(where + " contains duplicate layer_id " + std::to_string(layer_id));
      }
    }
    const std::vector<GroupBinding> bindings = BindingsOf(kind, decoder);
    for (const GroupBinding& binding : bindings) {
      for (const auto& [direction, name_template] :
           {std::pair<const char*, const std::string*>{"input", binding.input_template},
            std::pair<const char*, const std::string*>{"output", binding.output_template}}) {
        if (!IsLayerTemplate(*name_template)) {
          throw std::runtime_error(where + " binding '" + binding.name + "' has malformed " + direction +
                                   " template '" + *name_template + "'; expected exactly one %d");
        }
      }
    }
    if (kind == StateGroupKind::kPagedKv) {
      for (const int32_t layer_id : entry.layer_ids) {
        if (!paged_layers.insert(layer_id).second) {
          throw std::runtime_error(where + " overlaps another paged_kv group at layer_id " + std::to_string(layer_id));
        }
      }
    }
    for (const int32_t layer_id : entry.layer_ids) {
      for (const GroupBinding& binding : bindings) {
        for (const std::string* name_template : {binding.input_template, binding.output_template}) {
          const std::string name = ExpandLayerTemplate(*name_template, layer_id);
          if (!resolved_names.insert(name).second) {
            throw std::runtime_error(where + " resolves more than one binding to '" + name + "'");
          }
        }
      }
    }
    StateGroup group;
    group.kind = kind;
    group.layer_ids = entry.layer_ids;
    if (entry.state_update_json) group.state_update_json = *entry.state_update_json;
    groups.push_back(std::move(group));
  }
  if (any_state_update && any_fixed_without_state_update) {
    throw std::runtime_error("All fixed state groups must declare state_update when any fixed group declares it");
  }
  return groups;
}

// Decoder keys not read here (pipeline, vision/speech companions, ...) are tolerated: they belong
// to OGA model kinds outside the engine core.
void ParseDecoderSection(const Value& decoder_section, DecoderConfig& decoder,
                         std::optional<std::vector<ParsedStateGroup>>& state_groups) {
  for (const Member& member : decoder_section.members()) {
    const std::string& key = member.key;
    const Value& value = member.value;
    if (key == "filename") {
      decoder.filename = ReadString(value, key);
    } else if (key == "head_size") {
      decoder.head_size = ReadNonNegativeInt(value, key);
    } else if (key == "hidden_size") {
      decoder.hidden_size = ReadNonNegativeInt(value, key);
    } else if (key == "num_attention_heads") {
      decoder.num_attention_heads = ReadNonNegativeInt(value, key);
    } else if (key == "num_hidden_layers") {
      decoder.num_hidden_layers = ReadNonNegativeInt(value, key);
      // Layer ids are int32 and the legacy manifest lists every layer; no decoder comes close.
      if (decoder.num_hidden_layers > kMaxHiddenLayers) FailAt(value, "num_hidden_layers is out of range");
    } else if (key == "num_key_value_heads") {
      decoder.num_key_value_heads = ReadNonNegativeInt(value, key);
    } else if (key == "session_options") {
      decoder.session_options_json = json::Serialize(RequireObject(value, key));
    } else if (key == "sliding_window") {
      decoder.sliding_window = ParseSlidingWindow(RequireObject(value, key));
    } else if (key == "inputs") {
      ParseNameMap(RequireObject(value, key), kInputNameKeys, decoder.inputs);
    } else if (key == "outputs") {
      ParseNameMap(RequireObject(value, key), kOutputNameKeys, decoder.outputs);
    } else if (key == "state_groups") {
      state_groups = ParseStateGroups(value);
    } else if (key == "layer_types") {
      if (!value.is_array()) FailAt(value, "layer_types must be a list of strings");
      for (const Value& element : value.elements()) decoder.layer_types.push_back(ReadString(element, key));
    }
  }
}

// ---- model ----

std::vector<int32_t> ReadEosTokenIds(const Value& value) {
  constexpr std::string_view kName = "eos_token_id";
  if (value.is_number()) return {ReadInt32(value, kName)};
  if (!value.is_array()) FailAt(value, "eos_token_id must be an integer or a list of integers");
  if (value.elements().empty()) FailAt(value, "eos_token_id must not be an empty list");
  std::vector<int32_t> ids;
  ids.reserve(value.elements().size());
  for (const Value& element : value.elements()) ids.push_back(ReadInt32(element, kName));
  return ids;
}

void ParseModelSection(const Value& model, ModelConfig& config,
                       std::optional<std::vector<ParsedStateGroup>>& state_groups) {
  for (const Member& member : model.members()) {
    const std::string& key = member.key;
    const Value& value = member.value;
    if (key == "type") {
      config.model_type = ReadString(value, key);
    } else if (key == "vocab_size") {
      config.vocab_size = ReadInt(value, key);
    } else if (key == "context_length") {
      config.context_length = ReadPositiveInt(value, key);
    } else if (key == "eos_token_id") {
      config.eos_token_ids = ReadEosTokenIds(value);
    } else if (key == "bos_token_id") {
      config.bos_token_id = ReadInt32(value, key);
    } else if (key == "pad_token_id") {
      config.pad_token_id = ReadInt32(value, key);
    } else if (key == "decoder") {
      ParseDecoderSection(RequireObject(value, key), config.decoder, state_groups);
    }
    // Every other model key (sep_token_id, embedding, vision, speech, ...) belongs to model kinds
    // or loaders outside the engine core; OGA accepts them, so they pass through untyped.
  }
}

// ---- search ----

// Returns false for a key search does not know.
bool ApplySearchKey(const Member& member, SearchConfig& search) {
  const std::string& key = member.key;
  const Value& value = member.value;
  if (key == "max_length") {
    search.max_length = ReadInt(value, key);
  } else if (key == "min_length") {
    search.min_length = ReadInt(value, key);
  } else if (key == "num_beams") {
    search.num_beams = ReadInt(value, key);
  } else if (key == "batch_size") {
    search.batch_size = ReadInt(value, key);
  } else if (key == "do_sample") {
    search.do_sample = ReadBool(value, key);
  } else if (key == "top_k") {
    search.top_k = ReadInt(value, key);
  } else if (key == "top_p") {
    search.top_p = ReadNumber(value, key);
  } else if (key == "temperature") {
    search.temperature = ReadNumber(value, key);
  } else if (key == "repetition_penalty") {
    search.repetition_penalty = ReadNumber(value, key);
  } else if (key == "no_repeat_ngram_size") {
    search.no_repeat_ngram_size = ReadInt(value, key);
  } else if (key == "random_seed") {
    // OGA writes -1 for "no seed"; any negative seed means the same.
    const int64_t seed = ReadInt(value, key);
    if (seed < 0) {
      search.random_seed.reset();
    } else {
      search.random_seed = static_cast<uint64_t>(seed);
    }
  } else if (key == "chunk_size") {
    search.chunk_size = ReadNonNegativeInt(value, key);
  } else if (key == "early_stopping") {
    search.early_stopping = ReadBool(value, key);
  } else if (key == "past_present_share_buffer") {
    search.past_present_share_buffer = ReadBool(value, key);
  } else if (key == "length_penalty") {
    search.length_penalty = ReadNumber(value, key);
  } else if (key == "diversity_penalty") {
    search.diversity_penalty = ReadNumber(value, key);
  } else if (key == "num_return_sequences") {
    search.num_return_sequences = ReadInt(value, key);
  } else {
    return false;
  }
  return true;
}

void ParseSearchSection(const Value& search_section, SearchConfig& search) {
  for (const Member& member : search_section.members()) {
    if (!ApplySearchKey(member, search)) FailUnknownKey("search", member);
  }
}

// ---- engine ----

// Returns false for a key dynamic_batching does not know.
bool ApplyDynamicBatchingKey(const Member& member, DynamicBatchingConfig& dynamic) {
  const std::string& key = member.key;
  const Value& value = member.value;
  if (key == "block_size") {
    dynamic.block_size = ReadPositiveInt(value, key);
  } else if (key == "num_blocks") {
    dynamic.num_blocks = ReadPositiveInt(value, key);
  } else if (key == "gpu_utilization_factor") {
    const double factor = ReadNumber(value, key);
    if (!(factor > 0.0 && factor <= 1.0)) {
      FailAt(value, "gpu_utilization_factor must be > 0 and <= 1");
    }
    dynamic.gpu_utilization_factor = factor;
  } else if (key == "max_batch_size") {
    dynamic.max_batch_size = ReadPositiveInt(value, key);
  } else if (key == "max_scheduled_tokens") {
    dynamic.max_scheduled_tokens = ReadPositiveInt(value, key);
  } else if (key == "prefix_caching") {
    dynamic.prefix_caching = ReadBool(value, key);
  } else if (key == "preemption") {
    const std::string mode = ReadString(value, key);
    if (mode == "recompute") {
      dynamic.preemption = DynamicBatchingConfig::Preemption::Recompute;
    } else if (mode == "none") {
      dynamic.preemption = DynamicBatchingConfig::Preemption::None;
    } else {
      FailAt(value, "preemption must be \"recompute\" or \"none\", got \"" + mode + "\"");
    }
  } else if (key == "dflash2_max_snapshots") {
    ReadNonNegativeInt(value, key);  // only the DFlash-2 drafter reads it
  } else {
    return false;
  }
  return true;
}

// OGA 0.18 creates its dynamic-batching settings on the first key it reads, so an object with no
// key ("dynamic_batching": {}) leaves dynamic batching off. Reproduced: nullopt for {}.
std::optional<DynamicBatchingConfig> ParseDynamicBatching(const Value& section) {
  std::optional<DynamicBatchingConfig> dynamic;
  for (const Member& member : section.members()) {
    if (!dynamic) dynamic.emplace();
    if (!ApplyDynamicBatchingKey(member, *dynamic)) {
      FailUnknownKey("engine:dynamic_batching", member);
    }
  }
  return dynamic;
}

int64_t ParseStaticBatching(const Value& section) {
  int64_t max_batch_size = kDefaultStaticMaxBatchSize;
  for (const Member& member : section.members()) {
    if (member.key != "max_batch_size") FailUnknownKey("engine:static_batching", member);
    max_batch_size = ReadPositiveInt(member.value, member.key);
  }
  return max_batch_size;
}

// OGA keeps one batching mode: whichever of dynamic_batching / static_batching comes later in the
// document replaces the other.
void ParseEngineSection(const Value& engine, ModelConfig& config) {
  for (const Member& member : engine.members()) {
    if (member.key == "dynamic_batching") {
      config.static_max_batch_size = kDefaultStaticMaxBatchSize;
      config.dynamic_batching = ParseDynamicBatching(RequireObject(member.value, member.key));
    } else if (member.key == "static_batching") {
      config.dynamic_batching.reset();
      config.static_max_batch_size = ParseStaticBatching(RequireObject(member.value, member.key));
    } else if (member.key == "shared_generators") {
      config.shared_generators = ReadBool(member.value, member.key);
    } else {
      FailUnknownKey("engine", member);
    }
  }
}

// ---- test_model ----

void ParseTestModelSection(const Value& test_model, ModelConfig& config) {
  for (const Member& member : test_model.members()) {
    if (member.key == "per_token_logits") {
      config.test_per_token_logits = ReadBool(member.value, member.key);
    } else if (member.key == "max_block_table_columns") {
      config.test_max_block_table_columns = ReadNonNegativeInt(member.value, member.key);
    } else if (member.key == "windowed_block_table") {
      config.test_windowed_block_table = ReadBool(member.value, member.key);
    } else if (member.key == "fixed_state_row_words") {
      config.test_fixed_state_row_words = ReadNonNegativeInt(member.value, member.key);
      if (config.test_fixed_state_row_words < 2) FailAt(member.value, "test_model:fixed_state_row_words:must be 2 or greater");
    } else if (member.key == "fixed_state_capture") {
      config.test_fixed_state_capture = ReadBool(member.value, member.key);
    } else if (member.key == "cuda_graph") {
      config.test_cuda_graph = ReadBool(member.value, member.key);
    } else if (member.key == "device_ops") {
      config.test_device_ops = ReadBool(member.value, member.key);
    } else if (member.key == "device_logits") {
      config.test_device_logits = ReadBool(member.value, member.key);
    } else if (member.key == "device_sampling") {
      config.test_device_sampling = ReadBool(member.value, member.key);
    } else {
      FailUnknownKey("test_model", member);
    }
  }
}

// ---- file names: confined to the model directory ----

// OGA 0.18's check of every file name in genai_config.json, with its texts; `key_path` is the
// dotted key ("model.decoder.filename"). Lexical, as 0.18's: a name starting with a separator is
// absolute, and a ".." component (separators '/' and '\\') escapes. A symlink inside the directory
// is followed wherever it points, as 0.18 does. NUL separates components too: the loader reads the
// name up to its first NUL, and no prefix of a name that passes may end in "..".
void CheckConfigPath(const std::string& key_path, const std::string& path) {
  if (path.empty()) return;
  if (path.front() == '/' || path.front() == '\\') {
    throw std::runtime_error(key_path + ": Config path must be a relative path under the model directory, got: " +
                             path);
  }
  constexpr std::string_view kSeparators("/\\\0", 3);
  for (size_t start = 0; start <= path.size();) {
    size_t end = path.find_first_of(kSeparators, start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "..") == 0) {
      throw std::runtime_error(key_path + ": Config path must not contain path traversal (..): " + path);
    }
    start = end + 1;
  }
}

// model.<section>.<key> when it is of `type` (keys are unique: the parser rejects duplicates).
const Value* ModelValue(const Value& root, std::string_view section, std::string_view key, json::Type type) {
  const Value* model = root.Find("model");
  const Value* part = model != nullptr && model->is_object() ? model->Find(section) : nullptr;
  const Value* value = part != nullptr && part->is_object() ? part->Find(key) : nullptr;
  return value != nullptr && value->type() == type ? value : nullptr;
}

void CheckModelPath(const Value& root, std::string_view section, std::string_view key) {
  if (const Value* value = ModelValue(root, section, key, json::Type::kString)) {
    CheckConfigPath("model." + std::string(section) + "." + std::string(key), value->string_value());
  }
}

// model.<section>.pipeline: [{"<stage>": {"filename": ...}}, ...]
void CheckPipelinePaths(const Value& root, std::string_view section) {
  const Value* pipeline = ModelValue(root, section, "pipeline", json::Type::kArray);
  if (pipeline == nullptr) return;
  const std::string key_path = "model." + std::string(section) + ".pipeline.filename";
  for (const Value& stage : pipeline->elements()) {
    if (!stage.is_object()) continue;
    for (const Member& named : stage.members()) {
      if (!named.value.is_object()) continue;
      const Value* filename = named.value.Find("filename");
      if (filename != nullptr && filename->is_string()) CheckConfigPath(key_path, filename->string_value());
    }
  }
}

// Every file name 0.18 checks when it reads the config, in its order (observed side by side: the
// decoder's come last). oga loads only the decoder file; the others belong to model kinds oga does
// not run, checked so that a config 0.18 refuses is refused here with the same text.
void CheckConfigPaths(const Value& root, const ModelConfig& config) {
  CheckModelPath(root, "encoder", "filename");
  CheckModelPath(root, "embedding", "filename");
  for (const char* key : {"filename", "config_filename", "adapter_filename"}) CheckModelPath(root, "vision", key);
  CheckPipelinePaths(root, "vision");
  for (const char* key : {"filename", "config_filename", "adapter_filename"}) CheckModelPath(root, "speech", key);
  CheckModelPath(root, "joiner", "filename");
  CheckModelPath(root, "vad", "filename");
  for (const char* key : {"frontend_filename", "encoder_filename", "adapter_filename", "cross_kv_filename",
                          "decoder_kv_filename"}) {
    CheckModelPath(root, "moonshine", key);
  }
  CheckConfigPath("model.decoder.filename", config.decoder.filename);
  CheckPipelinePaths(root, "decoder");
}

// ---- whole-config checks (OGA's request-creation texts, no JSON position) ----

void ValidateVocabulary(const ModelConfig& config) {
  if (config.vocab_size < 1) {
    throw std::runtime_error("vocab_size must be 1 or greater, is " +
                             std::to_string(config.vocab_size));
  }
  for (const int32_t eos_token_id : config.eos_token_ids) {
    if (eos_token_id < 0 || eos_token_id >= config.vocab_size) {
      throw std::runtime_error("eos_token_id (" + std::to_string(eos_token_id) +
                               ") must be in range [0, " + std::to_string(config.vocab_size) +
                               ") (vocab_size)");
    }
  }
}

}  // namespace

const char* StateGroupKindName(StateGroupKind kind) {
  switch (kind) {
    case StateGroupKind::kPagedKv:
      return "paged_kv";
    case StateGroupKind::kFixedConv:
      return "fixed_conv";
    case StateGroupKind::kFixedRecurrent:
      return "fixed_recurrent";
  }
  return "invalid";
}

bool IsLayerTemplate(const std::string& name_template) {
  size_t count = 0;
  for (size_t at = name_template.find("%d"); at != std::string::npos; at = name_template.find("%d", at + 2)) ++count;
  return count == 1;
}

std::string ExpandLayerTemplate(const std::string& name_template, int32_t layer_id) {
  std::string name = name_template;
  const size_t at = name.find("%d");
  if (at != std::string::npos) name.replace(at, 2, std::to_string(layer_id));
  return name;
}

namespace {

// The groups model.decoder.layer_types implies (OGA's builder describes LFM2 this way, with
// past_conv_names / present_conv_names templates and no manifest): attention layers keep a KV
// cache, conv layers a fixed short-convolution state. Other layer kinds have no binding oga knows.
std::vector<StateGroup> LayerTypeStateGroups(const DecoderConfig& decoder) {
  if (static_cast<int64_t>(decoder.layer_types.size()) != decoder.num_hidden_layers) {
    throw std::runtime_error("model.decoder.layer_types lists " + std::to_string(decoder.layer_types.size()) +
                             " layers, but num_hidden_layers is " + std::to_string(decoder.num_hidden_layers));
  }
  StateGroup attention, conv;
  attention.kind = StateGroupKind::kPagedKv;
  conv.kind = StateGroupKind::kFixedConv;
  for (size_t layer = 0; layer < decoder.layer_types.size(); ++layer) {
    const std::string& type = decoder.layer_types[layer];
    if (type == "full_attention" || type == "sliding_attention") {
      attention.layer_ids.push_back(static_cast<int32_t>(layer));
    } else if (type == "conv") {
      conv.layer_ids.push_back(static_cast<int32_t>(layer));
    } else {
      throw std::runtime_error("model.decoder.layer_types[" + std::to_string(layer) + "] is '" + type +
                               "'; oga runs full_attention, sliding_attention and conv layers");
    }
  }
  std::vector<StateGroup> groups;
  if (!attention.layer_ids.empty()) groups.push_back(std::move(attention));
  if (!conv.layer_ids.empty()) groups.push_back(std::move(conv));
  return groups;
}

std::vector<StateGroup> EffectiveStateGroups(const DecoderConfig& decoder) {
  if (decoder.state_groups) return *decoder.state_groups;
  if (!decoder.layer_types.empty()) return LayerTypeStateGroups(decoder);
  StateGroup dense;
  dense.kind = StateGroupKind::kPagedKv;
  for (int64_t layer = 0; layer < decoder.num_hidden_layers; ++layer) {
    dense.layer_ids.push_back(static_cast<int32_t>(layer));
  }
  return {std::move(dense)};
}

}  // namespace

ModelConfig ParseModelConfig(const std::string& json_text) { return ParseModelConfig(json::Parse(json_text)); }

ModelConfig ParseModelConfig(const Value& root) {
  if (!root.is_object()) FailAt(root, "The configuration must be a JSON object");

  ModelConfig config;
  // Manifest checks need the whole decoder section (templates may follow state_groups).
  std::optional<std::vector<ParsedStateGroup>> state_groups;
  for (const Member& member : root.members()) {
    if (member.key == "model") {
      ParseModelSection(RequireObject(member.value, member.key), config, state_groups);
    } else if (member.key == "search") {
      ParseSearchSection(RequireObject(member.value, member.key), config.search);
    } else if (member.key == "engine") {
      ParseEngineSection(RequireObject(member.value, member.key), config);
    } else if (member.key == "test_model") {
      ParseTestModelSection(RequireObject(member.value, member.key), config);
    }
    // Other top-level sections (e.g. "speculative", "embedding") are OGA features the engine core
    // does not read; OGA accepts them, so they are skipped.
  }
  if (state_groups) config.decoder.state_groups = ValidateStateGroups(*state_groups, config.decoder);
  config.decoder.effective_state_groups = EffectiveStateGroups(config.decoder);
  CheckConfigPaths(root, config);
  ValidateVocabulary(config);
  return config;
}

}  // namespace oga
