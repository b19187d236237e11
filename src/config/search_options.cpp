#include "config/search_options.h"

#include <cmath>
#include <cstdint>
#include <sstream>

#include "base/errors.h"

namespace oga {
namespace {

enum class Kind { kBool, kInt, kNumber };

struct Option {
  const char* name;
  Kind kind;
};

// Alphabetical, as 0.18's get_search_options() returns them.
const Option kOptions[] = {
    {"batch_size", Kind::kInt},        {"chunk_size", Kind::kInt},
    {"diversity_penalty", Kind::kNumber}, {"do_sample", Kind::kBool},
    {"early_stopping", Kind::kBool},   {"length_penalty", Kind::kNumber},
    {"max_length", Kind::kInt},        {"min_length", Kind::kInt},
    {"no_repeat_ngram_size", Kind::kInt}, {"num_beams", Kind::kInt},
    {"num_return_sequences", Kind::kInt}, {"past_present_share_buffer", Kind::kBool},
    {"random_seed", Kind::kInt},       {"repetition_penalty", Kind::kNumber},
    {"temperature", Kind::kNumber},    {"top_k", Kind::kInt},
    {"top_p", Kind::kNumber},
};

const Option* Find(const std::string& name) {
  for (const Option& option : kOptions) {
    if (name == option.name) return &option;
  }
  return nullptr;
}

// 0.18 formats the offending value like a C++ stream does (%g-like: 10.5, 1e+20, 1.09951e+12).
std::string StreamFormat(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

int64_t CheckedInt32(const std::string& name, double value) {
  if (!std::isfinite(value)) throw ApiError("Field '" + name + "' cannot be converted to int32 (NaN or Inf)");
  if (value < INT32_MIN || value > INT32_MAX) {
    throw ApiError("Field '" + name + "' value " + StreamFormat(value) +
                   " is out of int32 range [-2147483648, 2147483647]");
  }
  if (value != std::floor(value)) throw ApiError("Field '" + name + "' value " + StreamFormat(value) + " is not an integer");
  return static_cast<int64_t>(value);
}

}  // namespace

const std::vector<std::pair<const char*, bool>>& SearchOptionNames() {
  static const std::vector<std::pair<const char*, bool>> names = [] {
    std::vector<std::pair<const char*, bool>> out;
    for (const Option& option : kOptions) out.emplace_back(option.name, option.kind == Kind::kBool);
    return out;
  }();
  return names;
}

void SetSearchOption(SearchConfig& search, const std::string& name, double value, bool is_bool) {
  const Option* option = Find(name);
  if (option == nullptr) throw ApiError(" Unknown value \"" + name + "\"");  // 0.18's text, leading space included
  if (option->kind == Kind::kBool && !is_bool) throw ApiError(name + " - Expected a bool but saw a number");
  if (option->kind != Kind::kBool && is_bool) throw ApiError(name + " - Expected a number but saw a bool");
  const int64_t integer = option->kind == Kind::kInt ? CheckedInt32(name, value) : 0;
  if (name == "do_sample") {
    search.do_sample = value != 0.0;
  } else if (name == "early_stopping") {
    search.early_stopping = value != 0.0;
  } else if (name == "past_present_share_buffer") {
    search.past_present_share_buffer = value != 0.0;
  } else if (name == "max_length") {
    search.max_length = integer;
  } else if (name == "min_length") {
    search.min_length = integer;
  } else if (name == "num_beams") {
    search.num_beams = integer;
  } else if (name == "num_return_sequences") {
    search.num_return_sequences = integer;
  } else if (name == "batch_size") {
    search.batch_size = integer;
  } else if (name == "top_k") {
    search.top_k = integer;
  } else if (name == "no_repeat_ngram_size") {
    search.no_repeat_ngram_size = integer;
  } else if (name == "chunk_size") {
    // As in genai_config.json's search section (0 = no chunking).
    if (integer < 0) throw ApiError("chunk_size must be >= 0");
    search.chunk_size = integer;
  } else if (name == "random_seed") {
    // OGA writes -1 for "no seed"; any negative seed means the same.
    if (integer < 0) {
      search.random_seed.reset();
    } else {
      search.random_seed = static_cast<uint64_t>(integer);
    }
  } else if (name == "top_p") {
    search.top_p = value;
  } else if (name == "temperature") {
    search.temperature = value;
  } else if (name == "repetition_penalty") {
    search.repetition_penalty = value;
  } else if (name == "length_penalty") {
    search.length_penalty = value;
  } else if (name == "diversity_penalty") {
    search.diversity_penalty = value;
  }
}

size_t CheckedMaxLength(const SearchConfig& search, int64_t context_length) {
  if (search.max_length <= 0) throw ApiError("search max_length is " + std::to_string(search.max_length));
  if (context_length > 0 && search.max_length > context_length) {
    throw ApiError("max_length (" + std::to_string(search.max_length) + ") cannot be greater than model context_length (" +
                   std::to_string(context_length) + ")");
  }
  return static_cast<size_t>(search.max_length);
}

double GetSearchNumber(const SearchConfig& search, const std::string& name) {
  const Option* option = Find(name);
  if (option == nullptr || option->kind == Kind::kBool) throw ApiError(name + " is an invalid name for GetSearchNumber.");
  if (name == "max_length") return static_cast<double>(search.max_length);
  if (name == "min_length") return static_cast<double>(search.min_length);
  if (name == "num_beams") return static_cast<double>(search.num_beams);
  if (name == "num_return_sequences") return static_cast<double>(search.num_return_sequences);
  if (name == "batch_size") return static_cast<double>(search.batch_size);
  if (name == "top_k") return static_cast<double>(search.top_k);
  if (name == "no_repeat_ngram_size") return static_cast<double>(search.no_repeat_ngram_size);
  if (name == "chunk_size") return static_cast<double>(search.chunk_size);
  if (name == "random_seed") return search.random_seed ? static_cast<double>(*search.random_seed) : -1.0;
  if (name == "top_p") return search.top_p;
  if (name == "temperature") return search.temperature;
  if (name == "repetition_penalty") return search.repetition_penalty;
  if (name == "length_penalty") return search.length_penalty;
  return search.diversity_penalty;
}

bool GetSearchBool(const SearchConfig& search, const std::string& name) {
  const Option* option = Find(name);
  if (option == nullptr || option->kind != Kind::kBool) throw ApiError(name + " is an invalid name for GetSearchBool.");
  if (name == "do_sample") return search.do_sample;
  if (name == "early_stopping") return search.early_stopping;
  return search.past_present_share_buffer;
}

}  // namespace oga
