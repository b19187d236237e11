// A model: its parsed configuration and the executor that runs its decoder. Engines share it.
#pragma once

#include <memory>
#include <string>

#include "fault_injector.h"
#include "model_config.h"
#include "oga/oga_ext.h"

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
  const std::shared_ptr<FaultInjector>& shared_faults() const { return faults_; }

 private:
  ModelConfig config_;
  OgaExtModelExecutor executor_;
  std::shared_ptr<FaultInjector> faults_;
};

// Creates the built-in deterministic test model (src/test_executor.cpp).
std::shared_ptr<Model> CreateTestModel(const std::string& config_json);

}  // namespace oga
