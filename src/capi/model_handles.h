// C handles for models, generator parameters, string arrays, sequences and snapshots.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "config/model_config.h"

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
