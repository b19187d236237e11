// The C API's handle types (include/oga/oga.h declares them opaque). The ones defined here are thin
// handles over core objects or plain values: results, models, generator parameters, string arrays,
// sequences and the capability / statistics snapshots. The others are core objects the engine
// itself works with, defined with their component: OgaConfig (config/config_handle.h), OgaEngine
// and OgaRequestOptions (engine/engine.h), OgaRequest (request/request.h), OgaTurnOptions
// (request/turn_options.h), OgaEngineEventBuffer, OgaEngineEvent and OgaTurnUsage
// (request/events.h), OgaGenerator (compat/generator.h) and OgaTensor (compat/tensor_handle.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "engine/model.h"
#include "oga/oga_ext.h"

// A failure: the message, and the kind of the core's error behind it.
struct OgaResult {
  std::string message;
  OgaExtErrorKind kind = OgaExtErrorKind_Api;
};

struct OgaModel {
  std::shared_ptr<oga::Model> model;
};

// A Generator's settings (and the seed-era request defaults): a copy of the model's search section
// that the caller may override, and whole-generation guidance.
struct OgaGeneratorParams {
  std::shared_ptr<oga::Model> model;
  oga::SearchConfig search;
  std::string guidance_type;  // empty = none
  std::string guidance_data;
};

struct OgaStringArray {
  std::vector<std::string> strings;
};

struct OgaSequences {
  std::vector<std::vector<int32_t>> sequences;
};

struct OgaEngineCapabilities {
  size_t configured_max_batch_size = 0;
  size_t max_scheduled_tokens = 0;
  uint64_t max_request_length = 0;
};

// A snapshot of the engine's caller-supplied draft telemetry; the key set is 0.18's so callers can
// read any key, and names without an oga counter (drafter, adaptive-k, n-gram and timing statistics
// of engine-hosted proposers) read 0.
struct OgaSpeculativeStats {
  std::map<std::string, uint64_t> counts;
  std::map<std::string, double> numbers;
  std::vector<uint64_t> acceptance_length_histogram = std::vector<uint64_t>(8, 0);
};
