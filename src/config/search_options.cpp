#include "config/search_options.h"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <type_traits>

#include "base/errors.h"

namespace oga {
namespace {

enum class Kind { kBool, kInt, kNumber };

// One option: its name, its kind, and how it is read from and written to a SearchConfig as a double
// (bools as 0 / 1). `set` receives a value already checked against the kind: for kInt an integer
// in int32 range.
struct Option {
  const char* name;
  Kind kind;
  double (*get)(const SearchConfig& search);
  void (*set)(SearchConfig& search, double value);
};

template <auto Member>
double Get(const SearchConfig& search) {
  return static_cast<double>(search.*Member);
}

template <auto Member>
void Set(SearchConfig& search, double value) {
  using Field = std::remove_reference_t<decltype(search.*Member)>;
  if constexpr (std::is_same_v<Field, bool>) {
    search.*Member = value != 0.0;
  } else {
    search.*Member = static_cast<Field>(value);
  }
}

template <auto Member, Kind K>
constexpr Option MemberOption(const char* name) {
  return Option{name, K, &Get<Member>, &Set<Member>};
}

double GetRandomSeed(const SearchConfig& search) {
  return search.random_seed ? static_cast<double>(*search.random_seed) : -1.0;
}

void SetRandomSeed(SearchConfig& search, double value) {
  // OGA writes -1 for "no seed"; any negative seed means the same.
  if (value < 0) {
    search.random_seed.reset();
  } else {
    search.random_seed = static_cast<uint64_t>(value);
  }
}

void SetChunkSize(SearchConfig& search, double value) {
  // As in genai_config.json's search section (0 = no chunking).
  if (value < 0) throw ApiError("chunk_size must be >= 0");
  search.chunk_size = static_cast<int64_t>(value);
}

// Alphabetical, as 0.18's get_search_options() returns them.
const Option kOptions[] = {
    MemberOption<&SearchConfig::batch_size, Kind::kInt>("batch_size"),
    {"chunk_size", Kind::kInt, &Get<&SearchConfig::chunk_size>, &SetChunkSize},
    MemberOption<&SearchConfig::diversity_penalty, Kind::kNumber>("diversity_penalty"),
    MemberOption<&SearchConfig::do_sample, Kind::kBool>("do_sample"),
    MemberOption<&SearchConfig::early_stopping, Kind::kBool>("early_stopping"),
    MemberOption<&SearchConfig::length_penalty, Kind::kNumber>("length_penalty"),
    MemberOption<&SearchConfig::max_length, Kind::kInt>("max_length"),
    MemberOption<&SearchConfig::min_length, Kind::kInt>("min_length"),
    MemberOption<&SearchConfig::no_repeat_ngram_size, Kind::kInt>("no_repeat_ngram_size"),
    MemberOption<&SearchConfig::num_beams, Kind::kInt>("num_beams"),
    MemberOption<&SearchConfig::num_return_sequences, Kind::kInt>("num_return_sequences"),
    MemberOption<&SearchConfig::past_present_share_buffer, Kind::kBool>("past_present_share_buffer"),
    {"random_seed", Kind::kInt, &GetRandomSeed, &SetRandomSeed},
    MemberOption<&SearchConfig::repetition_penalty, Kind::kNumber>("repetition_penalty"),
    MemberOption<&SearchConfig::temperature, Kind::kNumber>("temperature"),
    MemberOption<&SearchConfig::top_k, Kind::kInt>("top_k"),
    MemberOption<&SearchConfig::top_p, Kind::kNumber>("top_p"),
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

void SetSearchOption(SearchConfig& search, const std::string& name, double value, bool is_bool) {
  const Option* option = Find(name);
  if (option == nullptr) throw ApiError(" Unknown value \"" + name + "\"");  // 0.18's text, leading space included
  if (option->kind == Kind::kBool && !is_bool) throw ApiError(name + " - Expected a bool but saw a number");
  if (option->kind != Kind::kBool && is_bool) throw ApiError(name + " - Expected a number but saw a bool");
  option->set(search, option->kind == Kind::kInt ? static_cast<double>(CheckedInt32(name, value)) : value);
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
  return option->get(search);
}

bool GetSearchBool(const SearchConfig& search, const std::string& name) {
  const Option* option = Find(name);
  if (option == nullptr || option->kind != Kind::kBool) throw ApiError(name + " is an invalid name for GetSearchBool.");
  return option->get(search) != 0.0;
}

}  // namespace oga
