// Mix64: the splitmix64 finalizer, a cheap bijective 64-bit hash (prefix-cache block keys, the test
// executor's state chain).
#pragma once

#include <cstdint>

namespace oga {

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

}  // namespace oga
