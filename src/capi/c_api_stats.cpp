// C API: engine capabilities and speculative statistics snapshots.
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
#include "capi/handles.h"
#include "oga/oga.h"
#include "oga/oga_ext.h"

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

}  // namespace

extern "C" {

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

}  // extern "C"
