// C API: generator parameters and the Generator (generator.h).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/c_api_support.h"
#include "compat/generator.h"
#include "capi/handles.h"
#include "oga/oga.h"
#include "oga/oga_ext.h"
#include "config/search_options.h"
#include "compat/tensor_handle.h"

using oga::ApiError;
using oga::Guard;
using oga::RequireNotNull;

namespace {

constexpr const char* kGuidanceTypes[] = {"json_schema", "regex", "lark_grammar"};

[[noreturn]] void NotSupported(const char* function, const char* what) {
  throw ApiError(std::string(function) + " is not supported by oga (" + what +
                 " of onnxruntime-genai 0.18); see README 'Not supported by oga'.");
}

oga::Generator& Core(OgaGenerator* generator) {
  RequireNotNull(generator, "generator must not be null.");
  return *generator->generator;
}

}  // namespace

/* ----------------------------------------------------------------------------------------------
 * Generator parameters
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateGeneratorParams(const OgaModel* model, OgaGeneratorParams** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(model, "model must not be null.");
    RequireNotNull(out, "out must not be null.");
    auto params = std::make_unique<OgaGeneratorParams>();
    params->model = model->model;
    params->search = model->model->config().search;
    // 0.18 reports (and uses) context_length when the model's search section has no max_length.
    if (params->search.max_length == 0) params->search.max_length = model->model->config().context_length;
    *out = params.release();
  });
}

void OGA_API_CALL OgaDestroyGeneratorParams(OgaGeneratorParams* params) { delete params; }

OgaResult* OGA_API_CALL OgaGeneratorParamsSetSearchNumber(OgaGeneratorParams* params, const char* name, double value) {
  return Guard([&] {
    RequireNotNull(params, "params must not be null.");
    RequireNotNull(name, "name must not be null.");
    oga::SetSearchOption(params->search, name, value, false);
  });
}

OgaResult* OGA_API_CALL OgaGeneratorParamsSetSearchBool(OgaGeneratorParams* params, const char* name, bool value) {
  return Guard([&] {
    RequireNotNull(params, "params must not be null.");
    RequireNotNull(name, "name must not be null.");
    oga::SetSearchOption(params->search, name, value ? 1.0 : 0.0, true);
  });
}

OgaResult* OGA_API_CALL OgaExtGeneratorParamsSetSearchOptions(OgaGeneratorParams* params, size_t count,
                                                               const char* const* names, const double* numbers,
                                                               const int32_t* is_bool) {
  return Guard([&] {
    RequireNotNull(params, "params must not be null.");
    if (count != 0) {
      RequireNotNull(names, "names must not be null.");
      RequireNotNull(numbers, "numbers must not be null.");
      RequireNotNull(is_bool, "is_bool must not be null.");
    }
    oga::SearchConfig search = params->search;  // applied to a copy: all or none
    for (size_t i = 0; i < count; ++i) {
      RequireNotNull(names[i], "name must not be null.");
      const bool boolean = is_bool[i] != 0;
      oga::SetSearchOption(search, names[i], boolean ? (numbers[i] != 0 ? 1.0 : 0.0) : numbers[i], boolean);
    }
    params->search = std::move(search);
  });
}

OgaResult* OGA_API_CALL OgaGeneratorParamsGetSearchNumber(const OgaGeneratorParams* params, const char* name,
                                                          double* out) {
  return Guard([&] {
    RequireNotNull(params, "params must not be null.");
    RequireNotNull(name, "name must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = oga::GetSearchNumber(params->search, name);
  });
}

OgaResult* OGA_API_CALL OgaGeneratorParamsGetSearchBool(const OgaGeneratorParams* params, const char* name, bool* out) {
  return Guard([&] {
    RequireNotNull(params, "params must not be null.");
    RequireNotNull(name, "name must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = oga::GetSearchBool(params->search, name);
  });
}

OgaResult* OGA_API_CALL OgaGeneratorParamsSetGuidance(OgaGeneratorParams* params, const char* type, const char* data,
                                                      bool enable_ff_tokens) {
  return Guard([&] {
    RequireNotNull(params, "params must not be null.");
    RequireNotNull(type, "type must not be null.");
    RequireNotNull(data, "data must not be null.");
    const std::string guidance_type = type;
    if (!guidance_type.empty()) {
      bool known = false;
      for (const char* candidate : kGuidanceTypes) known = known || guidance_type == candidate;
      if (!known) {
        throw ApiError("Unknown guidance type \"" + guidance_type + "\"; expected json_schema, regex or lark_grammar.");
      }
    }
    if (enable_ff_tokens) {
      throw ApiError("enable_ff_tokens (guidance fast-forward tokens) is not supported by oga; see README 'Not "
                     "supported by oga'. Pass enable_ff_tokens=False: every token is generated by the model.");
    }
    params->guidance_type = guidance_type;
    params->guidance_data = guidance_type.empty() ? std::string() : std::string(data);
  });
}

OgaResult* OGA_API_CALL OgaGeneratorParamsSetSpeculativeNumber(OgaGeneratorParams*, const char*, double) {
  return Guard([&] { NotSupported("OgaGeneratorParamsSetSpeculativeNumber", "Generator speculative decoding"); });
}

OgaResult* OGA_API_CALL OgaGeneratorParamsSetSpeculativeBool(OgaGeneratorParams*, const char*, bool) {
  return Guard([&] { NotSupported("OgaGeneratorParamsSetSpeculativeBool", "Generator speculative decoding"); });
}

OgaResult* OGA_API_CALL OgaGeneratorParamsGetSpeculativeNumber(const OgaGeneratorParams*, const char*, double*) {
  return Guard([&] { NotSupported("OgaGeneratorParamsGetSpeculativeNumber", "Generator speculative decoding"); });
}

OgaResult* OGA_API_CALL OgaGeneratorParamsGetSpeculativeBool(const OgaGeneratorParams*, const char*, bool*) {
  return Guard([&] { NotSupported("OgaGeneratorParamsGetSpeculativeBool", "Generator speculative decoding"); });
}

/* ----------------------------------------------------------------------------------------------
 * Generator
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateGenerator(const OgaModel* model, const OgaGeneratorParams* params, OgaGenerator** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(model, "model must not be null.");
    RequireNotNull(params, "params must not be null.");
    RequireNotNull(out, "out must not be null.");
    if (params->model != model->model) {
      throw ApiError("The GeneratorParams were created for a different model than the Generator's.");
    }
    oga::GeneratorSettings settings;
    settings.search = params->search;
    settings.guidance_type = params->guidance_type;
    settings.guidance_data = params->guidance_data;
    auto handle = std::make_unique<OgaGenerator>();
    handle->generator = std::make_unique<oga::Generator>(model->model, settings);
    *out = handle.release();
  });
}

void OGA_API_CALL OgaDestroyGenerator(OgaGenerator* generator) { delete generator; }

bool OGA_API_CALL OgaGenerator_IsDone(OgaGenerator* generator) {
  if (generator == nullptr) return false;
  if (generator->generator->terminated()) return true;
  try {
    return generator->generator->IsDone();
  } catch (...) {
    return true;  // no error channel: stop the caller's loop
  }
}

OgaResult* OGA_API_CALL OgaExtGeneratorIsDone(OgaGenerator* generator, bool* out) {
  return Guard([&] {
    if (out != nullptr) *out = false;
    oga::Generator& core = Core(generator);
    RequireNotNull(out, "out must not be null.");
    *out = core.IsDone();
  });
}

bool OGA_API_CALL OgaGenerator_IsSessionTerminated(const OgaGenerator* generator) {
  return generator != nullptr && generator->generator->terminated();
}

OgaResult* OGA_API_CALL OgaGenerator_SetRuntimeOption(OgaGenerator* generator, const char* key, const char* value) {
  return Guard([&] {
    RequireNotNull(key, "key must not be null.");
    RequireNotNull(value, "value must not be null.");
    Core(generator).SetRuntimeOption(key, value);
  });
}

OgaResult* OGA_API_CALL OgaGenerator_AppendTokens(OgaGenerator* generator, const int32_t* input_ids,
                                                  size_t input_ids_count) {
  return Guard([&] {
    oga::Generator& core = Core(generator);
    if (input_ids == nullptr && input_ids_count != 0) throw ApiError("input_ids must not be null.");
    core.AppendTokens(input_ids, input_ids_count);
  });
}

OgaResult* OGA_API_CALL OgaGenerator_AppendTokenSequences(OgaGenerator* generator, const OgaSequences* sequences) {
  return Guard([&] {
    oga::Generator& core = Core(generator);
    RequireNotNull(sequences, "sequences must not be null.");
    core.AppendTokenSequences(sequences->sequences);
  });
}

OgaResult* OGA_API_CALL OgaGenerator_GenerateNextToken(OgaGenerator* generator) {
  return Guard([&] { Core(generator).GenerateNextToken(); });
}

OgaResult* OGA_API_CALL OgaGenerator_GetNextTokens(const OgaGenerator* generator, const int32_t** out,
                                                   size_t* out_count) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    if (out_count != nullptr) *out_count = 0;
    RequireNotNull(generator, "generator must not be null.");
    RequireNotNull(out, "out must not be null.");
    RequireNotNull(out_count, "out_count must not be null.");
    const std::vector<int32_t>& tokens = generator->generator->next_tokens();
    *out = tokens.data();
    *out_count = tokens.size();
  });
}

OgaResult* OGA_API_CALL OgaGenerator_RewindTo(OgaGenerator* generator, size_t new_length) {
  return Guard([&] { Core(generator).RewindTo(new_length); });
}

size_t OGA_API_CALL OgaGenerator_TokenCount(const OgaGenerator* generator) {
  return generator == nullptr ? 0 : generator->generator->token_count();
}

size_t OGA_API_CALL OgaGenerator_GetSequenceCount(const OgaGenerator* generator, size_t index) {
  if (generator == nullptr || index >= generator->generator->row_count()) return 0;
  return generator->generator->sequence(index).size();
}

const int32_t* OGA_API_CALL OgaGenerator_GetSequenceData(const OgaGenerator* generator, size_t index) {
  if (generator == nullptr || index >= generator->generator->row_count()) return nullptr;
  return generator->generator->sequence(index).data();
}

OgaResult* OGA_API_CALL OgaGenerator_GetLogits(OgaGenerator* generator, OgaTensor** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    oga::Generator& core = Core(generator);
    RequireNotNull(out, "out must not be null.");
    const std::vector<float>& logits = core.GetLogits();
    auto tensor = std::make_unique<OgaTensor>();
    tensor->type = OgaElementType_float32;
    tensor->shape = {static_cast<int64_t>(core.row_count()), 1, static_cast<int64_t>(core.vocab_size())};
    tensor->owned.resize(logits.size() * sizeof(float));
    std::memcpy(tensor->owned.data(), logits.data(), tensor->owned.size());
    tensor->data = tensor->owned.data();
    *out = tensor.release();
  });
}

OgaResult* OGA_API_CALL OgaGenerator_SetLogits(OgaGenerator* generator, OgaTensor* tensor) {
  return Guard([&] {
    oga::Generator& core = Core(generator);
    RequireNotNull(tensor, "tensor must not be null.");
    if (tensor->type != OgaElementType_float32) {
      throw ApiError("SetLogits takes float32 logits; the tensor's element type is " + std::to_string(tensor->type) + ".");
    }
    core.SetLogits(static_cast<const float*>(tensor->data), oga::ElementCount(tensor->shape));
  });
}

OgaResult* OGA_API_CALL OgaGenerator_GetSpeculativeStats(const OgaGenerator* generator, OgaSpeculativeStats** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(generator, "generator must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = std::make_unique<OgaSpeculativeStats>().release();  // nothing speculative runs: every value 0
  });
}

OgaResult* OGA_API_CALL OgaGenerator_SetInputs(OgaGenerator*, const OgaNamedTensors*) {
  return Guard([&] { NotSupported("OgaGenerator_SetInputs", "named model inputs (multimodal processors)"); });
}

OgaResult* OGA_API_CALL OgaGenerator_SetModelInput(OgaGenerator*, const char*, OgaTensor*) {
  return Guard([&] { NotSupported("OgaGenerator_SetModelInput", "extra model inputs by name"); });
}

OgaResult* OGA_API_CALL OgaGenerator_GetInput(const OgaGenerator*, const char*, OgaTensor** out) {
  if (out != nullptr) *out = nullptr;
  return Guard([&] { NotSupported("OgaGenerator_GetInput", "model inputs by name"); });
}

OgaResult* OGA_API_CALL OgaGenerator_GetOutput(const OgaGenerator*, const char*, OgaTensor** out) {
  if (out != nullptr) *out = nullptr;
  return Guard([&] { NotSupported("OgaGenerator_GetOutput", "model outputs by name"); });
}

OgaResult* OGA_API_CALL OgaGenerator_SetHiddenStates(OgaGenerator*, OgaTensor*) {
  return Guard([&] { NotSupported("OgaGenerator_SetHiddenStates", "hidden-state inputs"); });
}

OgaResult* OGA_API_CALL OgaGenerator_SnapshotState(OgaGenerator*) {
  return Guard([&] { NotSupported("OgaGenerator_SnapshotState", "recurrent-state snapshots"); });
}
