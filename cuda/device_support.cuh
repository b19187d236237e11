// What the kernel files share: logit loads and stores for fp32 and fp16 rows, the order-preserving
// key of a float, and warp-level scans and reductions.
//
// No includes: NVRTC compiles these files without the CUDA toolkit headers, and the kernel tests
// also compile them as plain C++ under a CPU emulator of the few CUDA built-ins used here
// (OGA_KERNEL_EMULATION, tests/kernel_emulator.h). Warp intrinsics are only ever called by all 32
// lanes of a warp with the full mask, so a block's size must be a multiple of 32.
#pragma once

#define OGA_FULL_WARP 0xFFFFFFFFu
#define OGA_NEGATIVE_INFINITY_BITS 0xFF800000u
#define OGA_HALF_NEGATIVE_INFINITY_BITS 0xFC00u

// Dynamic shared memory of a launch as an array of `type`.
#if defined(OGA_KERNEL_EMULATION)
#define OGA_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(oga_emulator_dynamic_shared())
#else
#define OGA_DYNAMIC_SHARED(type, name)                              \
  extern __shared__ __align__(16) unsigned char oga_dynamic_shared[]; \
  type* name = reinterpret_cast<type*>(oga_dynamic_shared)
#endif

// IEEE binary16 <-> binary32. The device has one instruction for each; the emulator needs the
// bit-exact equivalents (round to nearest even, like cvt.rn).
__device__ __forceinline__ float oga_half_to_float(unsigned short half) {
#if defined(__CUDA_ARCH__)
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(half));
  return value;
#else
  const unsigned int sign = static_cast<unsigned int>(half & 0x8000u) << 16;
  unsigned int exponent = (half >> 10) & 0x1Fu;
  unsigned int mantissa = half & 0x3FFu;
  unsigned int bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13);
  }
  return __uint_as_float(bits);
#endif
}

__device__ __forceinline__ unsigned short oga_float_to_half(float value) {
#if defined(__CUDA_ARCH__)
  unsigned short half;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(half) : "f"(value));
  return half;
#else
  const unsigned int bits = __float_as_uint(value);
  const unsigned int sign = (bits >> 16) & 0x8000u;
  const unsigned int magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<unsigned short>(sign | 0x7E00u);  // NaN
  if (magnitude >= 0x477FF000u) return static_cast<unsigned short>(sign | 0x7C00u);  // rounds to inf
  if (magnitude < 0x38800000u) {
    // Subnormal half (or zero): the value in units of 2^-24, rounded to nearest even.
    if (magnitude < 0x33000000u) return static_cast<unsigned short>(sign);  // below half of 2^-24
    const unsigned int exponent = magnitude >> 23;
    const unsigned int mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
    const unsigned int shift = 126u - exponent;  // 14 .. 24
    unsigned int result = mantissa >> shift;
    const unsigned int rest = mantissa & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (result & 1u))) ++result;
    return static_cast<unsigned short>(sign | result);
  }
  unsigned int result = ((magnitude >> 13) - (112u << 10));
  const unsigned int rest = magnitude & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;  // may carry into the exponent
  return static_cast<unsigned short>(sign | result);
#endif
}

// Logit rows of either element type, always handled as float.
__device__ __forceinline__ float oga_load_logit(const float* row, long long v) { return row[v]; }
__device__ __forceinline__ float oga_load_logit(const unsigned short* row, long long v) {
  return oga_half_to_float(row[v]);
}
__device__ __forceinline__ void oga_store_logit(float* row, long long v, float value) { row[v] = value; }
__device__ __forceinline__ void oga_store_logit(unsigned short* row, long long v, float value) {
  row[v] = oga_float_to_half(value);
}
__device__ __forceinline__ void oga_store_negative_infinity(float* row, long long v) {
  row[v] = __uint_as_float(OGA_NEGATIVE_INFINITY_BITS);
}
__device__ __forceinline__ void oga_store_negative_infinity(unsigned short* row, long long v) {
  row[v] = static_cast<unsigned short>(OGA_HALF_NEGATIVE_INFINITY_BITS);
}

// A key whose unsigned order is the float order, for radix selection: negative floats have their
// bits inverted, non-negative ones their sign bit set. -0 is first folded into +0 so that the two
// zeros tie, as they compare equal. Only used for values above -inf (NaN never gets a key).
__device__ __forceinline__ unsigned int oga_order_key(float value) {
  const unsigned int bits = value == 0.0f ? 0u : __float_as_uint(value);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ unsigned int oga_lane() { return threadIdx.x & 31u; }
__device__ __forceinline__ unsigned int oga_warp() { return threadIdx.x >> 5; }
__device__ __forceinline__ unsigned int oga_warp_count() { return blockDim.x >> 5; }

__device__ __forceinline__ unsigned long long oga_warp_sum(unsigned long long value) {
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(OGA_FULL_WARP, value, offset);
  return value;
}

// Inclusive prefix sum over the lanes of a warp (lane 0 first).
__device__ __forceinline__ unsigned long long oga_warp_inclusive_scan(unsigned long long value) {
  const unsigned int lane = oga_lane();
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned long long other = __shfl_up_sync(OGA_FULL_WARP, value, offset);
    if (lane >= static_cast<unsigned int>(offset)) value += other;
  }
  return value;
}

// The (value, index) pair that wins an argmax: the larger value, the lower index on ties; index -1
// (nothing seen) always loses.
__device__ __forceinline__ bool oga_argmax_better(float value, int index, float best_value, int best_index) {
  if (index < 0) return false;
  if (best_index < 0) return true;
  return value > best_value || (value == best_value && index < best_index);
}

__device__ __forceinline__ void oga_warp_argmax(float& value, int& index) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_value = __shfl_xor_sync(OGA_FULL_WARP, value, offset);
    const int other_index = __shfl_xor_sync(OGA_FULL_WARP, index, offset);
    if (oga_argmax_better(other_value, other_index, value, index)) {
      value = other_value;
      index = other_index;
    }
  }
}
