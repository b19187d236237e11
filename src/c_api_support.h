// Helpers shared by the C API translation units: result objects and the exception boundary.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "errors.h"
#include "oga/oga.h"

struct OgaResult {
  std::string message;
};

namespace oga {

inline OgaResult* MakeResult(const char* message) noexcept {
  try {
    return new OgaResult{message};
  } catch (...) {
    // Even the error object could not be allocated; a static result would be freed by the caller.
    return nullptr;
  }
}

// Runs `body`, turning any exception into an OgaResult. Nothing escapes into C.
template <typename Body>
OgaResult* Guard(Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const std::bad_alloc&) {
    return MakeResult("std::bad_alloc");
  } catch (const std::exception& error) {
    return MakeResult(error.what());
  } catch (...) {
    return MakeResult("Unknown error");
  }
}

template <typename T>
void RequireNotNull(const T* pointer, const char* message) {
  if (pointer == nullptr) throw ApiError(message);
}

}  // namespace oga
