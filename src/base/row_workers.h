// A small persistent thread pool for per-row work of one step (token selection: logits processing,
// sampling, guidance masks, stop-string peeks). Rows are independent, so a step's rows are shared
// among the owner thread and the workers; each participant has its own scratch. Nothing is
// allocated per step. Run returns once every row is done: it never waits for a worker that has not
// woken up, so a busy machine (ONNX Runtime's threads, other processes) costs at worst the rows
// run on the calling thread alone.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace oga {

class RowWorkers {
 public:
  using Task = void (*)(void* context, size_t row, size_t participant);

  // `participants` counts the calling thread: 1 means no worker threads.
  explicit RowWorkers(size_t participants);
  ~RowWorkers();
  RowWorkers(const RowWorkers&) = delete;
  RowWorkers& operator=(const RowWorkers&) = delete;

  size_t participants() const { return workers_.size() + 1; }
  // Runs task(context, row, participant) for every row in [0, rows) and returns when all are done.
  // If tasks throw, the exception of the lowest row is rethrown (so the outcome does not depend on
  // which thread ran what).
  void Run(size_t rows, Task task, void* context);

  // Participants for an engine: OGA_SAMPLER_THREADS when set (1 = no worker threads), else the
  // CPUs the process may run on, at most 8.
  static size_t DefaultParticipants();

 private:
  // One Run's rows: published under mutex_, copied by each worker that wakes for it.
  struct Job {
    uint64_t generation = 0;
    Task task = nullptr;
    void* context = nullptr;
    size_t rows = 0;
  };

  void Work(size_t participant);
  void Drain(size_t participant, const Job& job);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  Job job_;               // the latest Run's; guarded by mutex_
  bool stopping_ = false;  // guarded by mutex_

  // The low 32 bits of the current job's generation, then its next unclaimed row: claiming a row
  // checks both at once, so a worker holding an older job never takes a row of a newer one.
  std::atomic<uint64_t> claim_{0};
  std::atomic<size_t> completed_{0};        // rows of the current job that finished
  std::vector<std::exception_ptr> errors_;  // per participant: its first failure
  std::vector<size_t> error_rows_;
};

}  // namespace oga
