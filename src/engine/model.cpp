#include "engine/model.h"

#include <atomic>
#include <utility>

#include "base/errors.h"
#include "sampling/guidance.h"

namespace oga {
namespace {

std::atomic<OgaExtTokenTableLoader> g_token_table_loader{nullptr};

}  // namespace

void SetTokenTableLoader(OgaExtTokenTableLoader loader) { g_token_table_loader.store(loader); }

std::shared_ptr<const TokenTable> Model::token_table() {
  std::lock_guard<std::mutex> lock(text_mutex_);
  return LoadTokenTableLocked();
}

std::shared_ptr<const TokenTable> Model::LoadTokenTableLocked() {
  if (token_table_) return token_table_;
  if (directory_.empty()) {
    throw ApiError(
        "Stop strings and guidance need the model's tokenizer, and this model has no directory to read it from; set "
        "its token table with OgaExtModelSetTokenTable (oga.testing.set_token_table).");
  }
  const OgaExtTokenTableLoader loader = g_token_table_loader.load();
  if (loader == nullptr) {
    throw ApiError(
        "Stop strings and guidance need the model's tokenizer, and no token-table loader is registered: import the oga "
        "Python package, or set the table with OgaExtModelSetTokenTable.");
  }
  OgaExtTokenTable table{};
  char message[4096] = {};
  if (loader(directory_.c_str(), &table, message, sizeof(message)) != OgaExtExecutionStatus_Ok) {
    message[sizeof(message) - 1] = '\0';
    throw ApiError(std::string("Stop strings and guidance need the model's tokenizer, which failed to load: ") +
                   (message[0] != '\0' ? message : "the token-table loader failed without a message."));
  }
  token_table_ = std::make_shared<const TokenTable>(table);
  return token_table_;
}

void Model::SetTokenTable(std::shared_ptr<const TokenTable> table) {
  std::lock_guard<std::mutex> lock(text_mutex_);
  token_table_ = std::move(table);
  guidance_tokenizer_.reset();  // rebuilt from the new table by the next guided turn
}

std::shared_ptr<const GuidanceTokenizer> Model::guidance_tokenizer() {
  std::lock_guard<std::mutex> lock(text_mutex_);
  std::shared_ptr<const TokenTable> table = LoadTokenTableLocked();
  if (!guidance_tokenizer_) {
    guidance_tokenizer_ = std::make_shared<const GuidanceTokenizer>(table, static_cast<size_t>(config_.vocab_size),
                                                                    config_.eos_token_ids, directory_);
  }
  return guidance_tokenizer_;
}

Model::Model(ModelConfig config, const OgaExtModelExecutor& executor, std::shared_ptr<FaultInjector> faults)
    : config_(std::move(config)), executor_(executor), faults_(std::move(faults)) {}

Model::~Model() {
  if (executor_.release_model != nullptr) executor_.release_model(executor_.model_data);
}

}  // namespace oga
