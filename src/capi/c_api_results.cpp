// C API: failure results (OgaResult) and their kinds.
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

namespace oga {
OgaResult g_out_of_memory_result{"std::bad_alloc", OgaExtErrorKind_OutOfMemory};
}  // namespace oga

using oga::ApiError;
using oga::Guard;
using oga::RequireNotNull;

extern "C" {

/* ----------------------------------------------------------------------------------------------
 * Results
 * -------------------------------------------------------------------------------------------- */
const char* OGA_API_CALL OgaResultGetError(const OgaResult* result) {
  return result == nullptr ? nullptr : result->message.c_str();
}

void OGA_API_CALL OgaDestroyResult(OgaResult* result) {
  if (result != &oga::g_out_of_memory_result) delete result;
}

OgaExtErrorKind OGA_API_CALL OgaExtResultGetErrorKind(const OgaResult* result) {
  return result == nullptr ? OgaExtErrorKind_None : result->kind;
}

}  // extern "C"
