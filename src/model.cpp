#include "model.h"

#include <utility>

namespace oga {

Model::Model(ModelConfig config, const OgaExtModelExecutor& executor, std::shared_ptr<FaultInjector> faults)
    : config_(std::move(config)), executor_(executor), faults_(std::move(faults)) {}

Model::~Model() {
  if (executor_.release_model != nullptr) executor_.release_model(executor_.model_data);
}

}  // namespace oga
