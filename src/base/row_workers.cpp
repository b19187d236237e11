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

void RowWorkers::Drain(size_t participant) {
  for (size_t row = next_row_.fetch_add(1, std::memory_order_relaxed); row < rows_;
       row = next_row_.fetch_add(1, std::memory_order_relaxed)) {
    try {
      task_(context_, row, participant);
    } catch (...) {
      if (!errors_[participant] || row < error_rows_[participant]) {
        errors_[participant] = std::current_exception();
        error_rows_[participant] = row;
      }
    }
  }
}

void RowWorkers::Work(size_t participant) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    Drain(participant);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }
}

void RowWorkers::Run(size_t rows, Task task, void* context) {
  if (workers_.empty() || rows < 2) {
    for (size_t row = 0; row < rows; ++row) task(context, row, 0);
    return;
  }
  task_ = task;
  context_ = context;
  rows_ = rows;
  next_row_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = workers_.size();
    ++generation_;
  }
  start_.notify_all();
  Drain(0);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
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
