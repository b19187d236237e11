// C API: string arrays and token-id sequences.
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

extern "C" {

/* ----------------------------------------------------------------------------------------------
 * String arrays and sequences
 * -------------------------------------------------------------------------------------------- */
OgaResult* OGA_API_CALL OgaCreateStringArray(OgaStringArray** out) {
  return Guard([&] {
    RequireNotNull(out, "out must not be null.");
    *out = new OgaStringArray();
  });
}

OgaResult* OGA_API_CALL OgaCreateStringArrayFromStrings(const char* const* strs, size_t count, OgaStringArray** out) {
  return Guard([&] {
    if (out != nullptr) *out = nullptr;
    RequireNotNull(out, "out must not be null.");
    if (strs == nullptr && count != 0) throw ApiError("strs must not be null when count is nonzero.");
    auto array = std::make_unique<OgaStringArray>();
    array->strings.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      if (strs[i] == nullptr) throw ApiError("strs[" + std::to_string(i) + "] must not be null.");
      array->strings.emplace_back(strs[i]);
    }
    *out = array.release();
  });
}

OgaResult* OGA_API_CALL OgaStringArrayAddString(OgaStringArray* string_array, const char* str) {
  return Guard([&] {
    RequireNotNull(string_array, "string_array must not be null.");
    RequireNotNull(str, "str must not be null.");
    string_array->strings.emplace_back(str);
  });
}

OgaResult* OGA_API_CALL OgaStringArrayGetCount(const OgaStringArray* string_array, size_t* out) {
  return Guard([&] {
    RequireNotNull(string_array, "string_array must not be null.");
    RequireNotNull(out, "out must not be null.");
    *out = string_array->strings.size();
  });
}

OgaResult* OGA_API_CALL OgaStringArrayGetString(const OgaStringArray* string_array, size_t index, const char** out) {
  return Guard([&] {
    RequireNotNull(string_array, "string_array must not be null.");
    RequireNotNull(out, "out must not be null.");
    if (index >= string_array->strings.size()) {
      throw ApiError("index " + std::to_string(index) + " is out of range for a string array of " +
                     std::to_string(string_array->strings.size()) + " strings.");
    }
    *out = string_array->strings[index].c_str();
  });
}

void OGA_API_CALL OgaDestroyStringArray(OgaStringArray* string_array) { delete string_array; }

OgaResult* OGA_API_CALL OgaCreateSequences(OgaSequences** out) {
  return Guard([&] {
    RequireNotNull(out, "out must not be null.");
    *out = new OgaSequences();
  });
}

OgaResult* OGA_API_CALL OgaAppendTokenSequence(const int32_t* token_ptr, size_t token_cnt, OgaSequences* sequences) {
  return Guard([&] {
    RequireNotNull(sequences, "sequences must not be null.");
    if (token_ptr == nullptr && token_cnt != 0) throw ApiError("token_ptr must not be null when token_cnt is nonzero.");
    sequences->sequences.emplace_back(token_ptr, token_ptr + token_cnt);
  });
}

size_t OGA_API_CALL OgaSequencesCount(const OgaSequences* sequences) {
  return sequences == nullptr ? 0 : sequences->sequences.size();
}

size_t OGA_API_CALL OgaSequencesGetSequenceCount(const OgaSequences* sequences, size_t sequence_index) {
  if (sequences == nullptr || sequence_index >= sequences->sequences.size()) return 0;
  return sequences->sequences[sequence_index].size();
}

const int32_t* OGA_API_CALL OgaSequencesGetSequenceData(const OgaSequences* sequences, size_t sequence_index) {
  if (sequences == nullptr || sequence_index >= sequences->sequences.size()) return nullptr;
  return sequences->sequences[sequence_index].data();
}

void OGA_API_CALL OgaDestroySequences(OgaSequences* sequences) { delete sequences; }

}  // extern "C"
