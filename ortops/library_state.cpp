#include "library_state.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace ortops {

namespace {

bool PortableFromEnvironment() {
  const char* value = std::getenv("OGA_ORTOPS_PORTABLE");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

std::atomic<bool> portable_forced{PortableFromEnvironment()};
std::atomic<uint64_t> cache_copies{0};

}  // namespace

bool CpuHasAvx2FmaF16c() {
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

bool PortableForced() { return portable_forced.load(std::memory_order_relaxed); }
void SetPortableForced(bool forced) { portable_forced.store(forced, std::memory_order_relaxed); }
void CountCacheCopy() { cache_copies.fetch_add(1, std::memory_order_relaxed); }
uint64_t CacheCopies() { return cache_copies.load(std::memory_order_relaxed); }

}  // namespace ortops
