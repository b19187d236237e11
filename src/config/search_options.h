// GeneratorParams' search options by name (OgaGeneratorParamsSetSearchNumber / Bool and their
// getters): the names, kinds and error texts of onnxruntime-genai 0.18.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/model_config.h"

namespace oga {

// Sets option `name` of `search`; `is_bool` says which setter was called. Throws ApiError with
// 0.18's texts for an unknown name, a value of the wrong kind, or an integer option whose value is
// not an int32 integer. Nothing changes on failure.
void SetSearchOption(SearchConfig& search, const std::string& name, double value, bool is_bool);
// Reads a number (integer or floating) option; throws ApiError "<name> is an invalid name for
// GetSearchNumber." for bool options and unknown names.
double GetSearchNumber(const SearchConfig& search, const std::string& name);
// Reads a bool option; throws ApiError "<name> is an invalid name for GetSearchBool." otherwise.
bool GetSearchBool(const SearchConfig& search, const std::string& name);

// search.max_length as a Generator (and a step-API request) takes it: throws ApiError "search
// max_length is <n>" when it is not positive and 0.18's "max_length (<n>) cannot be greater than
// model context_length (<c>)" above a known context (context_length > 0).
size_t CheckedMaxLength(const SearchConfig& search, int64_t context_length);

}  // namespace oga
