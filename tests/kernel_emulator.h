// A CPU emulator of the CUDA built-ins the kernels in cuda/ use, so the CPU test suite can run the
// kernels themselves (not a re-implementation) against numpy references where no GPU exists.
//
// Every CUDA thread of a block is a coroutine on the calling OS thread (stacks set up with
// makecontext; switches by _setjmp/_longjmp, which unlike swapcontext make no system call). A
// thread runs until it waits at __syncthreads() or a warp intrinsic, then another one runs; a
// barrier opens when every thread of the block (or all 32 lanes of the warp) has arrived. The
// next thread to run is picked pseudo-randomly, so threads run ahead of each other by varying
// amounts and a read of shared memory that no barrier orders after its write tends to see a stale
// value. Blocks run one after the other. Atomics are plain read-modify-writes: nothing runs in
// between. A barrier that can never open (a thread returned early, a warp intrinsic called by part
// of a warp) is reported as an error instead of hanging. `__shared__` becomes `static`, which is
// right because blocks do not overlap; dynamic shared memory is filled with a junk pattern before
// each block, so a kernel that reads it before writing fails its test.
//
// This is no model of the GPU's memory system: races that the barriers do not order show up only
// when the scheduling happens to expose them, and the device tests (tests/gpu) remain the judge.
#pragma once

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

#include <cstddef>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define OGA_KERNEL_EMULATION 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

inline dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace oga_emulator {

struct Barrier {
  unsigned int arrived = 0;
  unsigned long long generation = 0;
};

struct Thread {
  ucontext_t context;  // the initial context: entry point and stack
  jmp_buf resume;      // where the thread continues after a yield
  std::vector<char> stack;
  bool started = false;
  bool done = false;
  const Barrier* waiting = nullptr;
  unsigned long long waiting_generation = 0;
};

struct Run {
  jmp_buf scheduler;
  std::vector<Thread> threads;
  Thread* current = nullptr;
  unsigned long long random = 0x9E3779B97F4A7C15ull;  // the scheduling order (fixed per process)
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<unsigned long long> lane_values;  // 32 per warp: what each lane offers a shuffle
  void (*thunk)(void**) = nullptr;
  void** params = nullptr;
  std::vector<unsigned char> dynamic_shared;
  std::string error;
};

inline Run& run() {
  static Run state;
  return state;
}

inline void Yield() {
  Run& r = run();
  if (_setjmp(r.current->resume) == 0) _longjmp(r.scheduler, 1);
}

// Arrive at `barrier` (which opens when `expected` threads have arrived) and wait for it to open.
inline void Wait(Barrier& barrier, unsigned int expected) {
  const unsigned long long generation = barrier.generation;
  if (++barrier.arrived == expected) {
    barrier.arrived = 0;
    ++barrier.generation;
    return;
  }
  Run& r = run();
  r.current->waiting = &barrier;
  r.current->waiting_generation = generation;
  while (barrier.generation == generation) Yield();
  r.current->waiting = nullptr;
}

inline unsigned int ThreadsPerBlock() { return blockDim.x * blockDim.y * blockDim.z; }

inline void RequireFullWarp(unsigned int mask, const char* what) {
  if (mask != 0xFFFFFFFFu) {
    Run& r = run();
    if (r.error.empty()) r.error = std::string(what) + " with a partial mask (the kernels never do that)";
  }
}

// Every lane offers `value`; returns what lane `source(lane)` offered (own value when out of range).
template <typename T, typename Source>
T Exchange(T value, Source source) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "shuffled values are at most 64 bits");
  Run& r = run();
  const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  unsigned long long raw = 0;
  memcpy(&raw, &value, sizeof(T));
  r.lane_values[warp * 32 + lane] = raw;
  Wait(r.warp_barriers[warp], 32);
  const int from = source(static_cast<int>(lane));
  T result = value;
  if (from >= 0 && from < 32) memcpy(&result, &r.lane_values[warp * 32 + static_cast<unsigned int>(from)], sizeof(T));
  Wait(r.warp_barriers[warp], 32);  // nobody overwrites a lane's value before everyone has read it
  return result;
}

inline void Entry() {
  Run& r = run();
  r.thunk(r.params);
  r.current->done = true;
  _longjmp(r.scheduler, 1);  // never returns: this stack is dropped
}

template <typename... Args, size_t... I>
void CallWith(void (*kernel)(Args...), void** params, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<Args>>*>(params[I])...);
}

template <typename... Args>
void Call(void (*kernel)(Args...), void** params) {
  CallWith(kernel, params, std::index_sequence_for<Args...>{});
}

inline std::map<std::string, void (*)(void**)>& Registry() {
  static std::map<std::string, void (*)(void**)> kernels;
  return kernels;
}

inline bool Register(const char* name, void (*thunk)(void**)) {
  Registry()[name] = thunk;
  return true;
}

// Runs one block to completion; false (with r.error set) on a barrier that can never open.
inline bool RunBlock() {
  Run& r = run();
  const unsigned int count = ThreadsPerBlock();
  r.threads.resize(count);
  r.block_barrier = Barrier();
  r.warp_barriers.assign((count + 31) / 32, Barrier());
  r.lane_values.assign(((count + 31) / 32) * 32, 0);
  for (unsigned char& byte : r.dynamic_shared) byte = 0xA5;
  for (unsigned int t = 0; t < count; ++t) {
    Thread& thread = r.threads[t];
    thread.stack.resize(64 * 1024);
    thread.started = false;
    thread.done = false;
    thread.waiting = nullptr;
    getcontext(&thread.context);
    thread.context.uc_stack.ss_sp = thread.stack.data();
    thread.context.uc_stack.ss_size = thread.stack.size();
    thread.context.uc_link = nullptr;
    makecontext(&thread.context, Entry, 0);
  }
  // volatile: the scheduler's locals must survive the _longjmp back into this frame.
  volatile unsigned int live = count;
  while (live > 0) {
    // The next thread: the first runnable one from a pseudo-random starting point.
    r.random = r.random * 6364136223846793005ull + 1442695040888963407ull;
    const unsigned int start = static_cast<unsigned int>(r.random >> 33) % count;
    volatile unsigned int t = count;
    for (unsigned int i = 0; i < count; ++i) {
      const unsigned int candidate = (start + i) % count;
      const Thread& thread = r.threads[candidate];
      if (thread.done) continue;
      if (thread.waiting != nullptr && thread.waiting->generation == thread.waiting_generation) continue;
      t = candidate;
      break;
    }
    if (t == count) {
      r.error = "deadlock: " + std::to_string(live) + " of " + std::to_string(count) +
                " threads wait at a barrier that the others never reach";
      return false;
    }
    Thread& thread = r.threads[t];
    threadIdx.x = t % blockDim.x;
    threadIdx.y = (t / blockDim.x) % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
    r.current = &thread;
    if (_setjmp(r.scheduler) == 0) {
      if (!thread.started) {
        thread.started = true;
        setcontext(&thread.context);
      }
      _longjmp(thread.resume, 1);
    }
    // Back when the thread waits or ends.
    if (r.threads[t].done) --live;
  }
  return r.error.empty();
}

}  // namespace oga_emulator

// The CUDA built-ins.
inline void __syncthreads() { oga_emulator::Wait(oga_emulator::run().block_barrier, oga_emulator::ThreadsPerBlock()); }

template <typename T>
T __shfl_sync(unsigned int mask, T value, int source_lane) {
  oga_emulator::RequireFullWarp(mask, "__shfl_sync");
  return oga_emulator::Exchange(value, [source_lane](int) { return source_lane & 31; });
}
template <typename T>
T __shfl_up_sync(unsigned int mask, T value, unsigned int delta) {
  oga_emulator::RequireFullWarp(mask, "__shfl_up_sync");
  return oga_emulator::Exchange(value, [delta](int lane) { return lane - static_cast<int>(delta); });
}
template <typename T>
T __shfl_xor_sync(unsigned int mask, T value, int lane_mask) {
  oga_emulator::RequireFullWarp(mask, "__shfl_xor_sync");
  return oga_emulator::Exchange(value, [lane_mask](int lane) { return (lane ^ lane_mask) & 31; });
}
inline unsigned int __ballot_sync(unsigned int mask, int predicate) {
  oga_emulator::RequireFullWarp(mask, "__ballot_sync");
  oga_emulator::Run& r = oga_emulator::run();
  const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  r.lane_values[warp * 32 + lane] = predicate ? 1u : 0u;
  oga_emulator::Wait(r.warp_barriers[warp], 32);
  unsigned int bits = 0;
  for (unsigned int l = 0; l < 32; ++l) bits |= static_cast<unsigned int>(r.lane_values[warp * 32 + l]) << l;
  oga_emulator::Wait(r.warp_barriers[warp], 32);
  return bits;
}

inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned int __float_as_uint(float x) {
  unsigned int bits;
  memcpy(&bits, &x, sizeof(bits));
  return bits;
}
inline float __uint_as_float(unsigned int bits) {
  float x;
  memcpy(&x, &bits, sizeof(x));
  return x;
}
template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
inline unsigned int atomicOr(unsigned int* address, unsigned int value) {
  const unsigned int old = *address;
  *address = old | value;
  return old;
}

inline void* oga_emulator_dynamic_shared() { return oga_emulator::run().dynamic_shared.data(); }

// Registers a kernel under its name for oga_emulator_launch.
#define OGA_EMULATE(kernel)                                   \
  static const bool oga_emulated_##kernel = oga_emulator::Register( \
      #kernel, [](void** p) { oga_emulator::Call(kernel, p); });

// The cuLaunchKernel of the emulator: `params` is the same array of pointers to arguments. Returns 0,
// or -1 with a message in `error`.
extern "C" int oga_emulator_launch(const char* name, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                                   unsigned int block_x, unsigned int block_y, unsigned int block_z,
                                   unsigned int shared_bytes, void** params, char* error, int error_size) {
  oga_emulator::Run& r = oga_emulator::run();
  r.error.clear();
  const auto found = oga_emulator::Registry().find(name);
  if (found == oga_emulator::Registry().end()) {
    r.error = std::string("no emulated kernel named ") + name;
  } else if (block_x * block_y * block_z == 0 || block_x * block_y * block_z > 1024 || block_x % 32 != 0) {
    r.error = "block shape must hold 32 to 1024 threads, x a multiple of 32";
  } else {
    r.thunk = found->second;
    r.params = params;
    r.dynamic_shared.assign(shared_bytes, 0);
    blockDim.x = block_x;
    blockDim.y = block_y;
    blockDim.z = block_z;
    gridDim.x = grid_x;
    gridDim.y = grid_y;
    gridDim.z = grid_z;
    for (unsigned int z = 0; z < grid_z && r.error.empty(); ++z) {
      for (unsigned int y = 0; y < grid_y && r.error.empty(); ++y) {
        for (unsigned int x = 0; x < grid_x && r.error.empty(); ++x) {
          blockIdx.x = x;
          blockIdx.y = y;
          blockIdx.z = z;
          oga_emulator::RunBlock();
        }
      }
    }
  }
  if (r.error.empty()) return 0;
  snprintf(error, static_cast<size_t>(error_size), "%s", r.error.c_str());
  return -1;
}
