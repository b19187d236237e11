// A request's random stream: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3"), keyed by the 64-bit seed and counting draws. A counter-based generator because the
// device sampler (cuda/philox.cuh, the same function) must produce the same draws from nothing but
// (key, counter): a step draws from a copy, and the transaction publishes the advanced counter only
// at commit, on the host or the device alike.
//
//   key     = (low 32 bits of the seed, high 32 bits)
//   counter = (low 32 bits of the draw index n, high 32 bits, 0, 0)
//   draw n  = u in [0, 1) from the first two output words: ((out0 << 21) | (out1 >> 11)) / 2^53
#pragma once

#include <cstdint>

namespace oga {

class RandomStream {
 public:
  RandomStream() { Seed(0); }
  explicit RandomStream(uint64_t seed) { Seed(seed); }
  // The stream keyed by `seed` whose next draw is draw `counter`.
  RandomStream(uint64_t seed, uint64_t counter) : key_(seed), counter_(counter) {}

  void Seed(uint64_t seed) {
    key_ = seed;
    counter_ = 0;
  }

  // Uniform in [0, 1) with 53 random bits; one Philox block per draw.
  double Uniform() {
    uint32_t out[4];
    Philox4x32_10(counter_++, key_, out);
    const uint64_t bits = (static_cast<uint64_t>(out[0]) << 21) | (static_cast<uint64_t>(out[1]) >> 11);
    return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
  }

  uint64_t key() const { return key_; }
  uint64_t counter() const { return counter_; }

  static void Philox4x32_10(uint64_t counter, uint64_t key, uint32_t out[4]) {
    uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
      }
      const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
      const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
      const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
      const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
      c0 = hi1 ^ c1 ^ k0;
      c1 = lo1;
      c2 = hi0 ^ c3 ^ k1;
      c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
  }

 private:
  uint64_t key_ = 0;
  uint64_t counter_ = 0;
};

}  // namespace oga
