// C API: models (through the registered loader, or with an executor or the built-in test model),
// token tables, guidance, and library introspection.
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

// ---- model loading ----

std::atomic<OgaExtModelLoader> g_model_loader{nullptr};

constexpr const char* kNoLoaderMessage =
    "No model loader is registered: import the oga Python package (it registers the ONNX Runtime executor) before "
    "calling OgaCreateModel.";

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
