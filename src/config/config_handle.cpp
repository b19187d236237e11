#include "config/config_handle.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "base/errors.h"

namespace oga {
namespace {

bool IsRegularFile(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

}  // namespace

OgaConfig LoadConfig(const std::string& config_path) {
  OgaConfig config;
  namespace fs = std::filesystem;
  // OGA 0.18 only takes the directory; naming genai_config.json itself is accepted as well.
  if (IsRegularFile(config_path)) {
    config.file_path = config_path;
    config.directory = fs::absolute(fs::path(config_path)).parent_path().string();
  } else {
    config.file_path = (fs::path(config_path) / "genai_config.json").string();
    config.directory = fs::absolute(fs::path(config_path)).lexically_normal().string();
    // lexically_normal keeps a trailing separator ("dir/" -> "dir/"); drop it for a clean name.
    while (config.directory.size() > 1 && config.directory.back() == '/') config.directory.pop_back();
  }
  std::ifstream file(config.file_path, std::ios::binary);
  if (!IsRegularFile(config.file_path) || !file) throw ApiError("Error opening " + config.file_path);
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw ApiError("Error opening " + config.file_path);
  json::Value root;
  try {
    root = json::Parse(text.str());
    PublishConfig(config, std::move(root));
  } catch (const json::Error& error) {
    throw ApiError("Error encountered while parsing '" + config.file_path + "' " + error.what());
  }
  return config;
}

void PublishConfig(OgaConfig& config, json::Value root) {
  ModelConfig parsed = ParseModelConfig(root);
  std::string text = json::Serialize(root);
  // Nothing below throws: the handle changes all at once or not at all.
  config.config = std::move(parsed);
  config.root = std::move(root);
  config.json_text = std::move(text);
  config.decoder_names.reset();
}

}  // namespace oga
