// Helpers shared by the C API translation units: result objects and the exception boundary.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "base/errors.h"
#include "capi/handles.h"
#include "oga/oga.h"
#include "oga/oga_ext.h"


namespace oga {

// The result returned when not even an OgaResult can be allocated: static, never freed
// (OgaDestroyResult ignores it), so an out-of-memory failure still reads as a failure.
extern OgaResult g_out_of_memory_result;

inline OgaResult* MakeResult(const char* message, OgaExtErrorKind kind = OgaExtErrorKind_Api) noexcept {
  try {
    return new OgaResult{message, kind};
  } catch (...) {
    return &g_out_of_memory_result;
  }
}

// Runs `body`, turning any exception into an OgaResult whose kind names the core's error type.
// Nothing escapes into C.
template <typename Body>
OgaResult* Guard(Body&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const std::bad_alloc&) {
    return &g_out_of_memory_result;
  } catch (const ApiError& error) {
    return MakeResult(error.what(), OgaExtErrorKind_Api);
  } catch (const ContractError& error) {
    return MakeResult(error.what(), OgaExtErrorKind_Contract);
  } catch (const RetryableStepError& error) {
    return MakeResult(error.what(), OgaExtErrorKind_Retryable);
  } catch (const DeviceError& error) {
    return MakeResult(error.what(), OgaExtErrorKind_Device);
  } catch (const InterruptedError& error) {
    return MakeResult(error.what(), OgaExtErrorKind_Interrupted);
  } catch (const std::exception& error) {
    return MakeResult(error.what(), OgaExtErrorKind_Internal);
  } catch (...) {
    return MakeResult("Unknown error", OgaExtErrorKind_Internal);
  }
}

template <typename T>
void RequireNotNull(const T* pointer, const char* message) {
  if (pointer == nullptr) throw ApiError(message);
}

}  // namespace oga
