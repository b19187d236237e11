// DeviceMemory: allocation and row copies for engine-owned state, on the executor's device through
// OgaExtDeviceOps, or in host memory when the executor provides none. Callers keep the pointer
// arrays they pass (no allocation per call here); a failed copy throws with the device's reason.
#pragma once

#include <cstddef>
#include <cstdint>

#include "oga/oga_ext.h"

namespace oga {

class DeviceMemory {
 public:
  explicit DeviceMemory(const OgaExtDeviceOps* ops) : ops_(ops) {}

  bool host() const { return ops_ == nullptr; }
  // Throws std::bad_alloc when the memory cannot be had.
  uint8_t* Allocate(size_t bytes) const;
  void Release(void* memory) const noexcept;
  // sources[i] -> destinations[i], `bytes` each. Throws std::runtime_error with the device's reason.
  void Copy(size_t count, const void* const* sources, void* const* destinations, size_t bytes) const;
  void FillZero(void* memory, size_t bytes) const;
  // Waits for every copy so far (a no-op on the host, whose copies are synchronous).
  void Synchronize() const;

 private:
  const OgaExtDeviceOps* ops_;
};

}  // namespace oga
