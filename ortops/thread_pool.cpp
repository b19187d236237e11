#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sched.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace ortops {

namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void Run(size_t count, void (*body)(void*, size_t), void* state) {
    // One loop at a time on the workers; a second caller meanwhile runs its loop alone instead of
    // waiting for the first.
    std::unique_lock<std::mutex> running(running_, std::try_to_lock);
    if (!running.owns_lock() || workers_.empty() || count < 2) {
      for (size_t i = 0; i < count; ++i) body(state, i);
      return;
    }
    body_.store(body, std::memory_order_relaxed);
    state_.store(state, std::memory_order_relaxed);
    count_.store(count, std::memory_order_relaxed);
    // Claims of a few iterations each, about kClaimsPerThread per thread: a claim is an atomic on a
    // line every thread writes, dearer than a small iteration (a decode step's linears split into
    // tasks of a microsecond or less), while a descheduled thread can hold up at most one claim.
    const size_t threads = workers_.size() + 1;
    grain_.store(std::max<size_t>(1, count / (threads * kClaimsPerThread)), std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t generation = (ticket_.load(std::memory_order_relaxed) >> 32) + 1;
    // Publishes the loop with its generation's first ticket. Sequentially consistent with the
    // sleepers' count: a worker going to sleep either is counted here or sees the new ticket.
    ticket_.store(generation << 32);
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    Claim(generation);
    // Only iterations a worker has already claimed are left: wait for those.
    for (int spins = 0; done_.load(std::memory_order_acquire) < count; ++spins) {
      if (spins < 4096)
        CpuRelax();
      else
        std::this_thread::yield();
    }
  }

 private:
  // Claims and runs iterations of `generation` until none is left (or a newer loop began).
  void Claim(uint64_t generation) {
    uint64_t ticket = ticket_.load(std::memory_order_acquire);
    while ((ticket >> 32) == generation) {
      const size_t index = static_cast<size_t>(ticket & 0xFFFFFFFFu);
      // The loop cannot end (nor a new one begin) while an index of it is unclaimed, so what is read
      // here belongs to this generation when the claim below succeeds (and is not used otherwise).
      const size_t count = count_.load(std::memory_order_relaxed);
      if (index >= count) return;
      void (*body)(void*, size_t) = body_.load(std::memory_order_relaxed);
      void* state = state_.load(std::memory_order_relaxed);
      const size_t end = std::min(count, index + grain_.load(std::memory_order_relaxed));
      if (ticket_.compare_exchange_weak(ticket, ticket + (end - index), std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        for (size_t i = index; i < end; ++i) body(state, i);
        done_.fetch_add(end - index, std::memory_order_acq_rel);
        ticket = ticket_.load(std::memory_order_acquire);
      }
    }
  }

  void Work() {
    uint64_t seen = 0;  // the last generation this worker took part in
    for (;;) {
      // A step's operators follow each other closely: spin a little for the next loop, then sleep.
      uint64_t generation = ticket_.load(std::memory_order_acquire) >> 32;
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
      for (int spins = 0; generation == seen; ++spins) {
        if ((spins & 63) == 63 && std::chrono::steady_clock::now() > spin_until) break;
        CpuRelax();
        generation = ticket_.load(std::memory_order_acquire) >> 32;
      }
      if (generation == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return stopping_ || (ticket_.load() >> 32) != seen; });
        sleeping_.fetch_sub(1);
        if (stopping_) return;
        generation = ticket_.load(std::memory_order_acquire) >> 32;
      }
      seen = generation;
      Claim(generation);
    }
  }

  // How long an idle worker watches for the next loop before it sleeps.
  static constexpr int kSpinMicroseconds = 50;
  static constexpr size_t kClaimsPerThread = 4;

  std::vector<std::thread> workers_;
  std::mutex running_;
  // (generation << 32) | next unclaimed index of the current loop
  std::atomic<uint64_t> ticket_{0};
  std::atomic<size_t> done_{0};
  std::atomic<void (*)(void*, size_t)> body_{nullptr};
  std::atomic<void*> state_{nullptr};
  std::atomic<size_t> count_{0};
  std::atomic<size_t> grain_{1};   // iterations a claim takes
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleeping_{0};
  bool stopping_ = false;
};

namespace {

// The CPUs this process may run on (its affinity mask), at most 16.
int DefaultThreads() {
  int cpus = 0;
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
#endif
  if (cpus <= 0) cpus = static_cast<int>(std::thread::hardware_concurrency());
  return cpus < 1 ? 1 : (cpus > 16 ? 16 : cpus);
}

// OGA_ORTOPS_THREADS: a count (0: ONNX Runtime's pool); unset, empty or not a count: the default.
int ThreadsFromEnvironment() {
  const char* value = std::getenv("OGA_ORTOPS_THREADS");
  if (value == nullptr || *value == '\0') return DefaultThreads();
  char* end = nullptr;
  const long threads = std::strtol(value, &end, 10);
  if (*end != '\0' || threads < 0 || threads > 256) return DefaultThreads();
  return static_cast<int>(threads);
}

std::mutex pool_mutex;
std::unique_ptr<ThreadPool> pool;
std::atomic<ThreadPool*> shared_pool{nullptr};
std::atomic<bool> initialized{false};
std::atomic<int> configured{-1};  // the count SetThreadPoolThreads set; -1: the environment's

// A forked child has none of the parent's workers: it forgets the parent's pool without destroying
// it (threads that do not exist cannot be joined) and makes its own, of the same size, on first use.
void ForgetPoolAfterFork() {
  (void)pool.release();
  shared_pool.store(nullptr);
  initialized.store(false);
}

}  // namespace

int SetThreadPoolThreads(int threads) {
  std::lock_guard<std::mutex> lock(pool_mutex);
  configured.store(threads < 0 ? 0 : threads);
  initialized.store(true);
  shared_pool.store(nullptr);
  pool.reset();
  if (threads > 0) {
    pool.reset(new ThreadPool(threads));
    shared_pool.store(pool.get());
  }
  return pool ? pool->threads() : 0;
}

int ThreadPoolThreads() {
  ThreadPool* p = SharedThreadPool();
  return p ? p->threads() : 0;
}

ThreadPool* SharedThreadPool() {
  static const int registered = pthread_atfork(nullptr, nullptr, ForgetPoolAfterFork);
  (void)registered;
  if (!initialized.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (!initialized.load()) {
      const int threads = configured.load() >= 0 ? configured.load() : ThreadsFromEnvironment();
      if (threads > 0) {
        pool.reset(new ThreadPool(threads));
        shared_pool.store(pool.get());
      }
      initialized.store(true, std::memory_order_release);
    }
  }
  return shared_pool.load(std::memory_order_acquire);
}

void RunOnPool(ThreadPool* p, size_t count, void (*body)(void*, size_t), void* state) { p->Run(count, body, state); }

}  // namespace ortops
