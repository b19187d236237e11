// The OgaConfig handle: a model directory's genai_config.json as an editable document plus its
// validated typed view. Every edit (overlay, provider change) is applied to a copy, validated in
// full, and published only on success, so a failed edit leaves the handle unchanged.
#pragma once

#include <string>

#include <memory>

#include "config/decoder_names.h"
#include "base/json.h"
#include "config/model_config.h"

struct OgaConfig {
  std::string directory;   // the model directory (absolute)
  std::string file_path;   // its genai_config.json
  oga::json::Value root;   // the effective document
  oga::ModelConfig config;  // ParseModelConfig(root)
  std::string json_text;   // json::Serialize(root), kept in step with root
  // The decoder names OgaExtConfigGetDecoderNames resolved for the current document (dropped by
  // every published edit).
  std::unique_ptr<oga::ResolvedDecoderNames> decoder_names;
};

namespace oga {

// Reads and validates `config_path` (a model directory, or its genai_config.json itself). Errors:
// "Error opening <file>" when the file cannot be read; positioned JSON errors prefixed with
// "Error encountered while parsing '<file>' " (OGA's texts); whole-config checks unprefixed.
OgaConfig LoadConfig(const std::string& config_path);

// Validates `root` in full and, on success only, publishes it into `config`.
void PublishConfig(OgaConfig& config, json::Value root);

}  // namespace oga
