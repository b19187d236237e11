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
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "json.h"
#include "model_config.h"

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

void ParseModelSection(const Value& model, ModelConfig& config) {
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
      RequireObject(value, key);  // its contents are read by the decoder-IO parser
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
  } else if (key == "early_stopping" || key == "past_present_share_buffer") {
    ReadBool(value, key);  // beam-search / static-cache settings the Engine has no use for
  } else if (key == "length_penalty" || key == "diversity_penalty") {
    ReadNumber(value, key);
  } else if (key == "num_return_sequences") {
    ReadInt(value, key);
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
    } else {
      FailUnknownKey("test_model", member);
    }
  }
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

ModelConfig ParseModelConfig(const std::string& json_text) {
  const Value root = json::Parse(json_text);
  if (!root.is_object()) FailAt(root, "The configuration must be a JSON object");

  ModelConfig config;
  for (const Member& member : root.members()) {
    if (member.key == "model") {
      ParseModelSection(RequireObject(member.value, member.key), config);
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
  ValidateVocabulary(config);
  return config;
}

}  // namespace oga
