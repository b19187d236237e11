// A model: its parsed configuration and the executor that runs its decoder. Engines share it.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "base/fault_injector.h"
#include "config/model_config.h"
#include "oga/oga_ext.h"
#include "sampling/token_table.h"

namespace oga {

class Model {
 public:
  // Takes ownership of executor.model_data (released through executor.release_model).
  Model(ModelConfig config, const OgaExtModelExecutor& executor, std::shared_ptr<FaultInjector> faults);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const OgaExtModelExecutor& executor() const { return executor_; }
  // Non-null only for test models.
  FaultInjector* faults() const { return faults_.get(); }

  // The directory genai_config.json came from; empty for models created without one.
  const std::string& directory() const { return directory_; }
  void set_directory(std::string directory) { directory_ = std::move(directory); }

  // Token text for stop strings and guidance, loaded on first use through the registered
  // token-table loader. Any thread. Throws ApiError when it cannot be loaded.
  std::shared_ptr<const TokenTable> token_table();
  void SetTokenTable(std::shared_ptr<const TokenTable> table);
  // llguidance's tokenizer for this model, built on first use from token_table().
  std::shared_ptr<const class GuidanceTokenizer> guidance_tokenizer();

 private:
  std::shared_ptr<const TokenTable> LoadTokenTableLocked();

  std::string directory_;
  std::mutex text_mutex_;  // guards the lazily loaded token table and guidance tokenizer
  std::shared_ptr<const TokenTable> token_table_;
  std::shared_ptr<const GuidanceTokenizer> guidance_tokenizer_;
  ModelConfig config_;
  OgaExtModelExecutor executor_;
  std::shared_ptr<FaultInjector> faults_;
};

// Creates the built-in deterministic test model (src/testing/test_executor.cpp).
std::shared_ptr<Model> CreateTestModel(const std::string& config_json);

void SetTokenTableLoader(OgaExtTokenTableLoader loader);

}  // namespace oga
