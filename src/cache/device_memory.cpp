#include "cache/device_memory.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "base/errors.h"

namespace oga {

namespace {

constexpr size_t kAlignment = 64;

[[noreturn]] void Fail(const char* what, int32_t status, const char* message) {
  if (status == static_cast<int32_t>(OgaExtExecutionStatus_Interrupted)) {
    throw InterruptedError(std::string("device ") + what + " was interrupted");
  }
  throw std::runtime_error(std::string("device ") + what + " failed: " +
                           (message[0] != '\0' ? message : "no reason given"));
}

}  // namespace

uint8_t* DeviceMemory::Allocate(size_t bytes) const {
  void* memory = nullptr;
  if (ops_ == nullptr) {
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    memory = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  } else {
    memory = ops_->allocate(ops_->context, bytes);
  }
  if (memory == nullptr) throw std::bad_alloc();
  return static_cast<uint8_t*>(memory);
}

void DeviceMemory::Release(void* memory) const noexcept {
  if (memory == nullptr) return;
  if (ops_ == nullptr) {
    std::free(memory);
  } else {
    ops_->release(ops_->context, memory);
  }
}

void DeviceMemory::Copy(size_t count, const void* const* sources, void* const* destinations, size_t bytes) const {
  if (count == 0) return;
  if (ops_ == nullptr) {
    for (size_t i = 0; i < count; ++i) std::memcpy(destinations[i], sources[i], bytes);
    return;
  }
  char message[512] = {};
  if (const int32_t status = ops_->copy(ops_->context, count, sources, destinations, bytes, message, sizeof(message)); status != 0) {
    message[sizeof(message) - 1] = '\0';
    Fail("copy", status, message);
  }
}

void DeviceMemory::FillZero(void* memory, size_t bytes) const {
  if (ops_ == nullptr) {
    std::memset(memory, 0, bytes);
    return;
  }
  char message[512] = {};
  if (const int32_t status = ops_->fill_zero(ops_->context, memory, bytes, message, sizeof(message)); status != 0) {
    message[sizeof(message) - 1] = '\0';
    Fail("fill", status, message);
  }
}

void DeviceMemory::Synchronize() const {
  if (ops_ == nullptr) return;
  char message[512] = {};
  if (const int32_t status = ops_->synchronize(ops_->context, message, sizeof(message)); status != 0) {
    message[sizeof(message) - 1] = '\0';
    Fail("synchronize", status, message);
  }
}

}  // namespace oga
