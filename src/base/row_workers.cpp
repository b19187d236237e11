#include "base/row_workers.h"

#if defined(__linux__)
#include <sched.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <string>

namespace oga {

size_t RowWorkers::DefaultParticipants() {
  if (const char* value = std::getenv("OGA_SAMPLER_THREADS"); value != nullptr && value[0] != '\0') {
    const long parsed = std::strtol(value, nullptr, 10);
    if (parsed >= 1) return static_cast<size_t>(std::min<long>(parsed, 64));
  }
  // The CPUs this process may run on (a container's cpuset), else the hardware threads.
  size_t available = std::thread::hardware_concurrency();
#if defined(__linux__)
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) available = static_cast<size_t>(CPU_COUNT(&allowed));
#endif
  return std::max<size_t>(1, std::min<size_t>(available == 0 ? 1 : available, 8));
}

RowWorkers::RowWorkers(size_t participants)
    : errors_(std::max<size_t>(participants, 1)), error_rows_(std::max<size_t>(participants, 1)) {
  workers_.reserve(participants > 1 ? participants - 1 : 0);
  try {
    for (size_t p = 1; p < participants; ++p) workers_.emplace_back([this, p] { Work(p); });
  } catch (...) {
    // No threads left to create: run with those that started.
  }
}

RowWorkers::~RowWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void RowWorkers::Drain(size_t participant, const Job& job) {
  const uint64_t generation = job.generation & 0xffffffffu;
  uint64_t claim = claim_.load(std::memory_order_acquire);
  for (;;) {
    // A row is claimed only while the claim word still names this job: a worker that woke late
    // (after its job's Run returned) finds another generation or no row left, and runs nothing.
    const uint64_t row = claim & 0xffffffffu;
    if ((claim >> 32) != generation || row >= job.rows) return;
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel, std::memory_order_acquire))
      continue;
    try {
      job.task(job.context, static_cast<size_t>(row), participant);
    } catch (...) {
      if (!errors_[participant] || row < error_rows_[participant]) {
        errors_[participant] = std::current_exception();
        error_rows_[participant] = static_cast<size_t>(row);
      }
    }
    if (completed_.fetch_add(1, std::memory_order_acq_rel) + 1 == job.rows) {
      // Taking the mutex orders this after a waiter's check of `completed_` (no lost wake-up).
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
    claim = claim_.load(std::memory_order_acquire);
  }
}

void RowWorkers::Work(size_t participant) {
  uint64_t seen = 0;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || job_.generation != seen; });
      if (stopping_) return;
      job = job_;
      seen = job.generation;
    }
    Drain(participant, job);
  }
}

void RowWorkers::Run(size_t rows, Task task, void* context) {
  if (workers_.empty() || rows < 2 || rows > 0xffffffffu) {
    for (size_t row = 0; row < rows; ++row) task(context, row, 0);
    return;
  }
  Job job;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = Job{job_.generation + 1, task, context, rows};
    job = job_;
    completed_.store(0, std::memory_order_relaxed);
    claim_.store((job.generation & 0xffffffffu) << 32, std::memory_order_release);
  }
  start_.notify_all();
  Drain(0, job);
  // Every row is claimed now; wait only for rows a worker is still running, never for a worker
  // that has not woken yet (on a loaded machine that wake-up costs more than the rows).
  for (int spin = 0; spin < 256 && completed_.load(std::memory_order_acquire) != rows; ++spin)
    std::this_thread::yield();
  if (completed_.load(std::memory_order_acquire) != rows) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return completed_.load(std::memory_order_acquire) == rows; });
  }
  std::exception_ptr first;
  size_t first_row = rows;
  for (size_t p = 0; p < errors_.size(); ++p) {
    if (errors_[p] && error_rows_[p] < first_row) {
      first = errors_[p];
      first_row = error_rows_[p];
    }
    errors_[p] = nullptr;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace oga
