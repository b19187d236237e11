// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
// Random123's philox4x32_10): the counter-based generator behind a request's random stream.
//
// A counter-based generator makes draw n a pure function of (seed, n): the sampling kernel needs no
// per-request generator state in device memory beyond one 64-bit counter, a step that is rolled back
// simply keeps its old counter, and the CPU sampler (src/base/random_stream.h) and the device kernels draw
// the same numbers for the same (seed, n).
//
//   key     = (low 32 bits of the seed, high 32 bits of the seed)
//   counter = (low 32 bits of n, high 32 bits of n, 0, 0)
//   draw n  = u in [0, 1): the 53-bit integer (out0 << 21) | (out1 >> 11), times 2^-53
//
// Each draw consumes one counter value. The header has no includes and compiles as CUDA (nvcc,
// NVRTC) and as plain C++ (host tests and the CPU reference), hence OGA_HOST_DEVICE.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define OGA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define OGA_HOST_DEVICE inline
#endif

// The Random123 multipliers and Weyl key increments (the golden ratio and sqrt(3) - 1, in 32 bits).
#define OGA_PHILOX_M0 0xD2511F53u
#define OGA_PHILOX_M1 0xCD9E8D57u
#define OGA_PHILOX_W0 0x9E3779B9u
#define OGA_PHILOX_W1 0xBB67AE85u

struct OgaPhiloxBlock {
  unsigned int word[4];
};

// One round: two 32x32->64 multiplies mix counter words 0 and 2 into all four.
OGA_HOST_DEVICE void oga_philox_round(unsigned int counter[4], unsigned int k0, unsigned int k1) {
  const unsigned long long product0 = static_cast<unsigned long long>(OGA_PHILOX_M0) * counter[0];
  const unsigned long long product1 = static_cast<unsigned long long>(OGA_PHILOX_M1) * counter[2];
  const unsigned int hi0 = static_cast<unsigned int>(product0 >> 32), lo0 = static_cast<unsigned int>(product0);
  const unsigned int hi1 = static_cast<unsigned int>(product1 >> 32), lo1 = static_cast<unsigned int>(product1);
  const unsigned int c1 = counter[1], c3 = counter[3];
  counter[0] = hi1 ^ c1 ^ k0;
  counter[1] = lo1;
  counter[2] = hi0 ^ c3 ^ k1;
  counter[3] = lo0;
}

// The full generator: ten rounds, the key bumped between consecutive rounds.
OGA_HOST_DEVICE OgaPhiloxBlock oga_philox4x32_10(unsigned int c0, unsigned int c1, unsigned int c2, unsigned int c3,
                                                 unsigned int k0, unsigned int k1) {
  unsigned int counter[4] = {c0, c1, c2, c3};
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += OGA_PHILOX_W0;
      k1 += OGA_PHILOX_W1;
    }
    oga_philox_round(counter, k0, k1);
  }
  OgaPhiloxBlock out;
  for (int i = 0; i < 4; ++i) out.word[i] = counter[i];
  return out;
}

// Draw `n` of the stream `seed`: uniform in [0, 1) with 53 random bits, so every double the CPU
// sampler can compare against is reachable and 1.0 never is.
OGA_HOST_DEVICE double oga_philox_uniform(unsigned long long seed, unsigned long long n) {
  const OgaPhiloxBlock block =
      oga_philox4x32_10(static_cast<unsigned int>(n), static_cast<unsigned int>(n >> 32), 0u, 0u,
                        static_cast<unsigned int>(seed), static_cast<unsigned int>(seed >> 32));
  const unsigned long long bits =
      (static_cast<unsigned long long>(block.word[0]) << 21) | static_cast<unsigned long long>(block.word[1] >> 11);
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}
