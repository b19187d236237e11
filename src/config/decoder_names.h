// The decoder as an executor sees it (OgaExtDecoderNames): every graph tensor name expanded from
// the layer templates, the state groups, and the sizes the graph is checked against, resolved once
// from the validated configuration, so no executor reads genai_config.json again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "oga/oga_ext.h"

namespace oga {

class ResolvedDecoderNames {
 public:
  // Throws ApiError with OGA 0.18's texts for a decoder state manifest that cannot be loaded (see
  // model loading in the seed's "Decoder state groups"), and for two bindings resolving to one name.
  ResolvedDecoderNames(const ModelConfig& config, const std::string& directory, const std::string& config_json);
  ResolvedDecoderNames(const ResolvedDecoderNames&) = delete;
  ResolvedDecoderNames& operator=(const ResolvedDecoderNames&) = delete;

  // Points into this object and into the configuration it was resolved from, which must outlive it.
  const OgaExtDecoderNames& view() const { return names_; }

 private:
  struct FixedState {
    OgaExtStateGroupKind kind;
    int32_t layer_id;
    std::string input, output;
  };

  std::string directory_, config_json_, session_options_json_;
  std::vector<int32_t> paged_layer_ids_;
  std::vector<std::string> past_keys_, past_values_, present_keys_, present_values_;
  std::vector<const char*> past_key_ptrs_, past_value_ptrs_, present_key_ptrs_, present_value_ptrs_;
  std::vector<FixedState> fixed_;
  std::vector<OgaExtFixedStateNames> fixed_views_;
  std::vector<int32_t> sliding_window_layers_;
  OgaExtDecoderNames names_{};
};

}  // namespace oga
