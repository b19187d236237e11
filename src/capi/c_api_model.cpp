// C API: results, models, capabilities, speculative statistics, string
// arrays, sequences, and the test-model and executor additions.
#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "capi/c_api_support.h"
#include "base/random_stream.h"
#include "config/config_handle.h"
#include "config/decoder_names.h"
#include "engine/engine.h"
#include "sampling/guidance.h"
#include "capi/model_handles.h"
#include "oga/oga.h"
#include "oga/oga_ext.h"

namespace oga {
OgaResult g_out_of_memory_result{"std::bad_alloc", OgaExtErrorKind_OutOfMemory};
}  // namespace oga

using oga::ApiError;
using oga::Guard;
using oga::RequireNotNull;

namespace {

constexpr const char* kSpeculativeCountNames[] = {
    "rounds", "completed_rounds", "interrupted_rounds", "active_rounds", "draft_tokens_proposed",
    "draft_tokens_evaluated", "draft_tokens_accepted", "correction_tokens", "bonus_tokens", "tokens_queued",
    "tokens_emitted", "tokens_discarded", "tokens_buffered", "draft_forward_passes", "target_forward_passes",
    "effective_k", "adaptive_k_increases", "adaptive_k_decreases", "adaptive_k_observations", "adaptive_k_probes",
    "cooldown_entries", "cooldown_steps", "cooldown_remaining", "standard_fallback_steps", "mtp_failures",
    "dflash2_failures", "dflash2_disables", "dflash2_admission_misses", "full_accept_rounds", "partial_accept_rounds",
    "zero_accept_rounds", "target_verify_forward_passes", "target_reanchor_forward_passes",
    "target_reconciliation_forward_passes", "ngram_lookup_hits", "ngram_lookup_misses", "ngram_lookup_tokens_proposed",
    "ngram_chained_tokens_proposed", "ngram_grammar_candidate_rejections", "ngram_history_syncs",
    "ngram_history_tokens_synced"};
constexpr const char* kSpeculativeBoolNames[] = {"formula_supported"};
constexpr const char* kSpeculativeNumberNames[] = {
    "total_draft_ms", "total_target_ms", "total_reconciliation_ms", "total_target_verify_ms",
    "total_target_reanchor_ms", "total_ngram_history_sync_ms", "total_ngram_lookup_ms", "avg_draft_ms_per_token",
    "acceptance_rate", "avg_draft_tokens_per_round", "mean_emitted_tokens_per_round", "expected_tokens_per_round",
    "avg_target_ms_per_round", "target_baseline_ms_per_token", "target_overhead_ratio", "estimated_speedup",
    "observed_speedup", "adaptive_k_throughput"};

template <size_t N>
bool Contains(const char* const (&names)[N], const char* name) {
  for (const char* candidate : names) {
    if (std::strcmp(candidate, name) == 0) return true;
  }
  return false;
}



// ---- model loading ----

std::atomic<OgaExtModelLoader> g_model_loader{nullptr};

constexpr const char* kNoLoaderMessage =
    "No model loader is registered: import the oga Python package (it registers the ONNX Runtime executor) before "
    "calling OgaCreateModel.";

oga::json::Value NewObject() { return oga::json::Value::Object({}, {}, {}); }

// model.decoder.session_options.provider_options of `root`, created (as OGA writes it: a list of
// {"<provider>": {option: value}} objects) where missing.
std::vector<oga::json::Value>& ProviderOptions(oga::json::Value& root) {
  oga::json::Value* section = &root;
  for (const char* key : {"model", "decoder", "session_options"}) {
    oga::json::Value* child = section->Find(key);
    if (child == nullptr || !child->is_object()) child = &section->Set(key, NewObject());
    section = child;
  }
  oga::json::Value* list = section->Find("provider_options");
  if (list == nullptr || !list->is_array()) list = &section->Set("provider_options", oga::json::Value::Array({}, {}, {}));
  return list->mutable_elements();
}

// The options object of `provider` in the list, appended when absent.
oga::json::Value& ProviderEntry(std::vector<oga::json::Value>& providers, const std::string& provider) {
  for (oga::json::Value& entry : providers) {
    if (!entry.is_object()) continue;
    if (oga::json::Value* options = entry.Find(provider)) {
      if (!options->is_object()) *options = NewObject();
      return *options;
    }
  }
  oga::json::Value entry = NewObject();
  entry.Set(provider, NewObject());
  providers.push_back(std::move(entry));
  return *providers.back().Find(provider);
}

template <typename Edit>
void EditConfig(OgaConfig& config, Edit&& edit) {
  oga::json::Value root = config.root;
  edit(root);
  oga::PublishConfig(config, std::move(root));
}

void ReleaseModelData(const OgaExtModelExecutor& executor) {
  if (executor.release_model != nullptr) executor.release_model(executor.model_data);
}

// Creates the model through the registered loader. The loader's model_data belongs to the model
// from the moment the loader returns, also when creation fails afterwards.
std::unique_ptr<OgaModel> LoadModel(const OgaConfig& handle) {
  const oga::ResolvedDecoderNames names(handle.config, handle.directory, handle.json_text);
  const OgaExtModelLoader loader = g_model_loader.load();
  if (loader == nullptr) throw ApiError(kNoLoaderMessage);
  OgaExtModelExecutor executor{};
  char message[4096] = {};
  const OgaExtExecutionStatus status = loader(&names.view(), &executor, message, sizeof(message));
  message[sizeof(message) - 1] = '\0';
  if (status != OgaExtExecutionStatus_Ok) {
    ReleaseModelData(executor);
    throw ApiError(message[0] != '\0' ? std::string(message) : std::string("The model loader failed without a message."));
  }
  try {
    if (executor.open_engine == nullptr || executor.execute == nullptr || executor.close_engine == nullptr) {
      throw ApiError("The model loader returned an executor without open_engine, execute or close_engine.");
    }
    auto model = std::make_unique<OgaModel>();
    model->model = std::make_shared<oga::Model>(handle.config, executor, nullptr);
    model->model->set_directory(handle.directory);
    return model;
  } catch (...) {
    ReleaseModelData(executor);
    throw;
  }
}

}  // namespace

extern "C" {

/* ----------------------------------------------------------------------------------------------
 * Results
 * -------------------------------------------------------------------------------------------- */
const char* OGA_API_CALL OgaResultGetError(const OgaResult* result) {
  return result == nullptr ? nullptr : result->message.c_str();
}

void OGA_API_CALL OgaDestroyResult(OgaResult* result) {
  if (result != &oga::g_out_of_memory_result) delete result;
}

OgaExtErrorKind OGA_API_CALL OgaExtResultGetErrorKind(const OgaResult* result) {
  return result == nullptr ? OgaExtErrorKind_None : result->kind;
}

/* ----------------------------------------------------------------------------------------------
 * Models and generator parameters
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateModel(const char* config_path, OgaModel** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(config_path, "config_path must not be null.");
    RequireNotNull(out, "out must not be null.");
    const OgaConfig config = oga::LoadConfig(config_path);
    *out = LoadModel(config).release();
  });
}

OgaResult* OGA_API_CALL OgaCreateModelFromConfig(const OgaConfig* config, OgaModel** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(config, "config must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = LoadModel(*config).release();
  });
}

void OGA_API_CALL OgaExtSetModelLoader(OgaExtModelLoader loader) { g_model_loader.store(loader); }

/* ----------------------------------------------------------------------------------------------
 * Configurations
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateConfig(const char* config_path, OgaConfig** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(config_path, "config_path must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = new OgaConfig(oga::LoadConfig(config_path));
  });
}

void OGA_API_CALL OgaDestroyConfig(OgaConfig* config) { delete config; }

OgaResult* OGA_API_CALL OgaConfigOverlay(OgaConfig* config, const char* json) {
  return Guard([&] {
    RequireNotNull(config, "config must not be null.");
    RequireNotNull(json, "json must not be null.");
    // Parsed alone first, so syntax errors (and, after merging, errors in overlaid values) point
    // into the overlay text, as OGA's do.
    const oga::json::Value overlay = oga::json::Parse(json);
    EditConfig(*config, [&](oga::json::Value& root) { oga::json::MergeInto(root, overlay); });
  });
}

OgaResult* OGA_API_CALL OgaConfigClearProviders(OgaConfig* config) {
  return Guard([&] {
    RequireNotNull(config, "config must not be null.");
    EditConfig(*config, [](oga::json::Value& root) { ProviderOptions(root).clear(); });
  });
}

OgaResult* OGA_API_CALL OgaConfigAppendProvider(OgaConfig* config, const char* provider) {
  return Guard([&] {
    RequireNotNull(config, "config must not be null.");
    RequireNotNull(provider, "provider must not be null.");
    if (*provider == '\0') throw ApiError("provider must not be empty.");
    EditConfig(*config, [&](oga::json::Value& root) { ProviderEntry(ProviderOptions(root), provider); });
  });
}

OgaResult* OGA_API_CALL OgaConfigSetProviderOption(OgaConfig* config, const char* provider, const char* key,
                                                   const char* value) {
  return Guard([&] {
    RequireNotNull(config, "config must not be null.");
    RequireNotNull(provider, "provider must not be null.");
    RequireNotNull(key, "key must not be null.");
    RequireNotNull(value, "value must not be null.");
    if (*provider == '\0') throw ApiError("provider must not be empty.");
    EditConfig(*config, [&](oga::json::Value& root) {
      ProviderEntry(ProviderOptions(root), provider).Set(key, oga::json::Value::String(value, {}, {}));
    });
  });
}

OgaResult* OGA_API_CALL OgaExtConfigGetJson(const OgaConfig* config, const char** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(config, "config must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = config->json_text.c_str();
  });
}

OgaResult* OGA_API_CALL OgaExtConfigGetDecoderNames(const OgaConfig* config, const OgaExtDecoderNames** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(config, "config must not be null.");
    RequireNotNull(out, "out must not be null.");
    // Resolved on first use and kept with the document; the handle's edits are not concurrent.
    auto& names = const_cast<OgaConfig*>(config)->decoder_names;
    if (!names) names = std::make_unique<oga::ResolvedDecoderNames>(config->config, config->directory, config->json_text);
    *out = &names->view();
  });
}

void OGA_API_CALL OgaDestroyModel(OgaModel* model) { delete model; }

OgaResult* OGA_API_CALL OgaExtCreateModelWithExecutor(const char* config_json, const OgaExtModelExecutor* executor,
                                                      OgaModel** out) {
  // model_data belongs to the model from here on, also when creation fails.
  auto release = [executor]() {
    if (executor != nullptr && executor->release_model != nullptr) executor->release_model(executor->model_data);
  };
  OgaResult* result = Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(config_json, "config_json must not be null.");
    RequireNotNull(executor, "executor must not be null.");
    RequireNotNull(out, "out must not be null.");
    if (executor->open_engine == nullptr || executor->execute == nullptr || executor->close_engine == nullptr) {
      throw ApiError("executor must provide open_engine, execute and close_engine.");
    }
    oga::ModelConfig config = oga::ParseModelConfig(config_json);
    auto handle = std::make_unique<OgaModel>();
    handle->model = std::make_shared<oga::Model>(std::move(config), *executor, nullptr);
    *out = handle.release();
  });
  if (result != nullptr) release();
  return result;
}

OgaResult* OGA_API_CALL OgaExtCreateTestModel(const char* config_json, OgaModel** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(config_json, "config_json must not be null.");
    RequireNotNull(out, "out must not be null.");
    auto handle = std::make_unique<OgaModel>();
    handle->model = oga::CreateTestModel(config_json);
    *out = handle.release();
  });
}

void OGA_API_CALL OgaExtSetTokenTableLoader(OgaExtTokenTableLoader loader) { oga::SetTokenTableLoader(loader); }

OgaResult* OGA_API_CALL OgaExtModelSetTokenTable(OgaModel* model, const OgaExtTokenTable* table) {
  return Guard([&] {
    RequireNotNull(model, "model must not be null.");
    RequireNotNull(table, "table must not be null.");
    model->model->SetTokenTable(std::make_shared<const oga::TokenTable>(*table));
  });
}

void OGA_API_CALL OgaExtSetTokenizeFunction(OgaExtTokenizeFunction tokenize) { oga::SetTokenizeFunction(tokenize); }

OgaResult* OGA_API_CALL OgaExtSetGuidanceLibrary(const char* path) {
  return Guard([&] { oga::SetGuidanceLibraryPath(path != nullptr ? path : ""); });
}

OgaResult* OGA_API_CALL OgaExtTestModelInjectFault(OgaModel* model, OgaExtFaultPhase phase, OgaExtExecutionStatus kind,
                                                   uint64_t skip, uint64_t count) {
  return Guard([&] {
    RequireNotNull(model, "model must not be null.");
    if (model->model->faults() == nullptr) throw ApiError("Fault injection requires a test model.");
    if (phase >= oga::FaultInjector::kPhaseCount) throw ApiError("Unknown fault phase " + std::to_string(phase) + ".");
    if (kind > OgaExtExecutionStatus_Interrupted) throw ApiError("Unknown fault kind " + std::to_string(kind) + ".");
    model->model->faults()->Arm(phase, kind, skip, count);
  });
}

/* ----------------------------------------------------------------------------------------------
 * Capabilities and speculative statistics
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaEngineGetCapabilities(const OgaEngine* engine, OgaEngineCapabilities** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    const oga::Engine& core = *engine->engine;
    core.CheckOwnerThread();
    auto capabilities = std::make_unique<OgaEngineCapabilities>();
    capabilities->configured_max_batch_size = core.max_batch_size();
    capabilities->max_scheduled_tokens = core.max_scheduled_tokens();
    capabilities->max_request_length = core.max_request_length();
    *out = capabilities.release();
  });
}

size_t OGA_API_CALL OgaEngineCapabilitiesGetConfiguredMaxBatchSize(const OgaEngineCapabilities* capabilities) {
  return capabilities == nullptr ? 0 : capabilities->configured_max_batch_size;
}

size_t OGA_API_CALL OgaEngineCapabilitiesGetMaxScheduledTokens(const OgaEngineCapabilities* capabilities) {
  return capabilities == nullptr ? 0 : capabilities->max_scheduled_tokens;
}

uint64_t OGA_API_CALL OgaEngineCapabilitiesGetMaxRequestLength(const OgaEngineCapabilities* capabilities) {
  return capabilities == nullptr ? 0 : capabilities->max_request_length;
}

void OGA_API_CALL OgaDestroyEngineCapabilities(OgaEngineCapabilities* capabilities) { delete capabilities; }

OgaResult* OGA_API_CALL OgaEngineGetSpeculativeStats(const OgaEngine* engine, OgaSpeculativeStats** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(engine, "engine must not be null.");
    RequireNotNull(out, "out must not be null.");
    engine->engine->CheckOwnerThread();
    const oga::SpeculativeCounters& c = engine->engine->speculative_counters();
    auto stats = std::make_unique<OgaSpeculativeStats>();
    stats->counts = {{"rounds", c.rounds},
                     {"completed_rounds", c.rounds},
                     {"draft_tokens_proposed", c.draft_tokens_proposed},
                     {"draft_tokens_evaluated", c.draft_tokens_evaluated},
                     {"draft_tokens_accepted", c.draft_tokens_accepted},
                     {"correction_tokens", c.correction_tokens},
                     {"bonus_tokens", c.bonus_tokens},
                     {"tokens_emitted", c.tokens_emitted},
                     {"target_forward_passes", c.target_forward_passes},
                     {"target_verify_forward_passes", c.target_forward_passes},
                     {"full_accept_rounds", c.full_accept_rounds},
                     {"partial_accept_rounds", c.partial_accept_rounds},
                     {"zero_accept_rounds", c.zero_accept_rounds}};
    auto ratio = [](uint64_t a, uint64_t b) { return b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b); };
    stats->numbers = {{"acceptance_rate", ratio(c.draft_tokens_accepted, c.draft_tokens_evaluated)},
                      {"avg_draft_tokens_per_round", ratio(c.draft_tokens_evaluated, c.rounds)},
                      {"mean_emitted_tokens_per_round", ratio(c.tokens_emitted, c.rounds)}};
    stats->acceptance_length_histogram.assign(c.acceptance_length_histogram.begin(), c.acceptance_length_histogram.end());
    *out = stats.release();
  });
}

void OGA_API_CALL OgaDestroySpeculativeStats(OgaSpeculativeStats* stats) { delete stats; }

OgaResult* OGA_API_CALL OgaSpeculativeStatsGetCount(const OgaSpeculativeStats* stats, const char* name,
                                                    uint64_t* value) {
  return Guard([&] {
    if (stats == nullptr || name == nullptr || value == nullptr) throw ApiError("stats, name, and value must not be null.");
    if (!Contains(kSpeculativeCountNames, name)) {
      throw ApiError(std::string(name) + " is an invalid name for OgaSpeculativeStatsGetCount.");
    }
    const auto found = stats->counts.find(name);
    *value = found != stats->counts.end() ? found->second : 0;
  });
}

OgaResult* OGA_API_CALL OgaSpeculativeStatsGetNumber(const OgaSpeculativeStats* stats, const char* name,
                                                     double* value) {
  return Guard([&] {
    if (stats == nullptr || name == nullptr || value == nullptr) throw ApiError("stats, name, and value must not be null.");
    if (!Contains(kSpeculativeNumberNames, name)) {
      throw ApiError(std::string(name) + " is an invalid name for OgaSpeculativeStatsGetNumber.");
    }
    const auto found = stats->numbers.find(name);
    *value = found != stats->numbers.end() ? found->second : 0.0;
  });
}

OgaResult* OGA_API_CALL OgaSpeculativeStatsGetBool(const OgaSpeculativeStats* stats, const char* name, bool* value) {
  return Guard([&] {
    if (stats == nullptr || name == nullptr || value == nullptr) throw ApiError("stats, name, and value must not be null.");
    if (!Contains(kSpeculativeBoolNames, name)) {
      throw ApiError(std::string(name) + " is an invalid name for OgaSpeculativeStatsGetBool.");
    }
    *value = false;
  });
}

OgaResult* OGA_API_CALL OgaSpeculativeStatsGetAcceptanceLengthHistogramSize(const OgaSpeculativeStats* stats,
                                                                            size_t* out) {
  return Guard([&] {
    if (stats == nullptr || out == nullptr) throw ApiError("stats and value must not be null.");
    *out = stats->acceptance_length_histogram.size();
  });
}

OgaResult* OGA_API_CALL OgaSpeculativeStatsGetAcceptanceLengthCount(const OgaSpeculativeStats* stats, size_t length,
                                                                    uint64_t* out) {
  return Guard([&] {
    if (stats == nullptr || out == nullptr) throw ApiError("stats and value must not be null.");
    if (length >= stats->acceptance_length_histogram.size()) {
      throw ApiError("length " + std::to_string(length) + " is outside the acceptance length histogram.");
    }
    *out = stats->acceptance_length_histogram[length];
  });
}

/* ----------------------------------------------------------------------------------------------
 * String arrays and sequences
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateStringArray(OgaStringArray** out) {
  return Guard([&] {
    RequireNotNull(out, "out must not be null.");
    *out = new OgaStringArray();
  });
}

OgaResult* OGA_API_CALL OgaCreateStringArrayFromStrings(const char* const* strs, size_t count, OgaStringArray** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(out, "out must not be null.");
    if (strs == nullptr && count != 0) throw ApiError("strs must not be null when count is nonzero.");
    auto array = std::make_unique<OgaStringArray>();
    array->strings.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      if (strs[i] == nullptr) throw ApiError("strs[" + std::to_string(i) + "] must not be null.");
      array->strings.emplace_back(strs[i]);
    }
    *out = array.release();
  });
}

OgaResult* OGA_API_CALL OgaStringArrayAddString(OgaStringArray* string_array, const char* str) {
  return Guard([&] {
    RequireNotNull(string_array, "string_array must not be null.");
    RequireNotNull(str, "str must not be null.");
    string_array->strings.emplace_back(str);
  });
}

OgaResult* OGA_API_CALL OgaStringArrayGetCount(const OgaStringArray* string_array, size_t* out) {
  return Guard([&] {
    RequireNotNull(string_array, "string_array must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = string_array->strings.size();
  });
}

OgaResult* OGA_API_CALL OgaStringArrayGetString(const OgaStringArray* string_array, size_t index, const char** out) {
  return Guard([&] {
    RequireNotNull(string_array, "string_array must not be null.");
    RequireNotNull(out, "out must not be null.");
    if (index >= string_array->strings.size()) {
      throw ApiError("index " + std::to_string(index) + " is out of range for a string array of " +
                     std::to_string(string_array->strings.size()) + " strings.");
    }
    *out = string_array->strings[index].c_str();
  });
}

void OGA_API_CALL OgaDestroyStringArray(OgaStringArray* string_array) { delete string_array; }

OgaResult* OGA_API_CALL OgaCreateSequences(OgaSequences** out) {
  return Guard([&] {
    RequireNotNull(out, "out must not be null.");
    *out = new OgaSequences();
  });
}

OgaResult* OGA_API_CALL OgaAppendTokenSequence(const int32_t* token_ptr, size_t token_cnt, OgaSequences* sequences) {
  return Guard([&] {
    RequireNotNull(sequences, "sequences must not be null.");
    if (token_ptr == nullptr && token_cnt != 0) throw ApiError("token_ptr must not be null when token_cnt is nonzero.");
    sequences->sequences.emplace_back(token_ptr, token_ptr + token_cnt);
  });
}

size_t OGA_API_CALL OgaSequencesCount(const OgaSequences* sequences) {
  return sequences == nullptr ? 0 : sequences->sequences.size();
}

size_t OGA_API_CALL OgaSequencesGetSequenceCount(const OgaSequences* sequences, size_t sequence_index) {
  if (sequences == nullptr || sequence_index >= sequences->sequences.size()) return 0;
  return sequences->sequences[sequence_index].size();
}

const int32_t* OGA_API_CALL OgaSequencesGetSequenceData(const OgaSequences* sequences, size_t sequence_index) {
  if (sequences == nullptr || sequence_index >= sequences->sequences.size()) return nullptr;
  return sequences->sequences[sequence_index].data();
}

void OGA_API_CALL OgaDestroySequences(OgaSequences* sequences) { delete sequences; }

/* ----------------------------------------------------------------------------------------------
 * Library path
 * -------------------------------------------------------------------------------------------- */
const char* OGA_API_CALL OgaExtLibraryPath(void) {
  static const std::string path = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&OgaExtLibraryPath), &info) == 0 || info.dli_fname == nullptr) {
      return std::string();
    }
    return std::string(info.dli_fname);
  }();
  return path.c_str();
}

void OGA_API_CALL OgaExtPhilox4x32_10(uint64_t counter, uint64_t key, uint32_t out[4]) {
  if (out != nullptr) oga::RandomStream::Philox4x32_10(counter, key, out);
}

}  // extern "C"
