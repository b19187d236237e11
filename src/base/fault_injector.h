// Fault injection for transaction tests: armed through OgaExtTestModelInjectFault, consulted by the
// engine (and the test executor) at each transaction phase. Only test models carry one.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "oga/oga_ext.h"

namespace oga {

class FaultInjector {
 public:
  static constexpr uint32_t kPhaseCount = 9;

  // Any thread.
  void Arm(OgaExtFaultPhase phase, OgaExtExecutionStatus kind, uint64_t skip, uint64_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    arms_[phase] = Arming{kind, skip, count};
    UpdateArmedLocked();
  }

  // Returns the status to report for this consultation of `phase`: Ok unless a fault fires.
  OgaExtExecutionStatus Consult(OgaExtFaultPhase phase) {
    if (!armed_.load(std::memory_order_acquire)) return OgaExtExecutionStatus_Ok;
    std::lock_guard<std::mutex> lock(mutex_);
    Arming& arming = arms_[phase];
    if (arming.count == 0) return OgaExtExecutionStatus_Ok;
    if (arming.skip > 0) {
      --arming.skip;
      return OgaExtExecutionStatus_Ok;
    }
    --arming.count;
    UpdateArmedLocked();
    return arming.kind == OgaExtExecutionStatus_Ok ? OgaExtExecutionStatus_Retryable : arming.kind;
  }

 private:
  struct Arming {
    OgaExtExecutionStatus kind = OgaExtExecutionStatus_Ok;
    uint64_t skip = 0;
    uint64_t count = 0;
  };

  void UpdateArmedLocked() {
    bool any = false;
    for (const Arming& arming : arms_) any = any || arming.count > 0;
    armed_.store(any, std::memory_order_release);
  }

  std::mutex mutex_;
  Arming arms_[kPhaseCount];
  std::atomic<bool> armed_{false};
};

}  // namespace oga
