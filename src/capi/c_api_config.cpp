// C API: configurations (OgaConfig): loading, overlays, providers, and the resolved decoder.
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

}  // namespace

extern "C" {

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

}  // extern "C"
