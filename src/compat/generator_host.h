// GeneratorHost: one engine shared by every Generator of a model whose configuration asks for it
// (engine.shared_generators), run by a background owner thread.
//
// Each Generator keeps its rows, its pacing and its 0.18 semantics (generator.h); only where its
// requests live changes: on the host's engine, beside every other Generator's. The owner thread
// runs the Generators' engine work when they ask for it (Call: begin a turn, grant a token,
// hold logits, cancel, truncate, close) between steps, and otherwise steps the engine whenever any
// request is schedulable, delivering each event to the Generator whose row it belongs to. A
// Generator waiting for its tokens (WaitFor) wakes when a step delivered them. So N threads each
// running an unchanged Generator loop are N sets of requests of one continuously batched engine,
// and each gets the tokens it would get alone (the engine's results do not depend on batching).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/model.h"

namespace oga {

class GeneratorHost {
 public:
  // The host of `model`'s shared engine, created (with its owner thread and engine) on first use
  // and kept while any Generator uses it. Throws ApiError when the engine cannot be created or the
  // model cannot share one (a static model, or preemption "none").
  static std::shared_ptr<GeneratorHost> Of(const std::shared_ptr<Model>& model);
  ~GeneratorHost();
  GeneratorHost(const GeneratorHost&) = delete;
  GeneratorHost& operator=(const GeneratorHost&) = delete;

  // The shared engine: use it only inside Call (on the owner thread).
  Engine& engine() { return *engine_; }
  // Runs `work` on the owner thread between steps and returns when it ran; rethrows what it threw.
  // On the owner thread itself (an executor callback), it runs `work` at once.
  void Call(const std::function<void()>& work);
  // Blocks until `ready()` holds. `ready` runs under the host's lock, after every step and every
  // Wake, so it sees the rows the owner thread delivered events to. Rethrows the engine's failure.
  void WaitFor(const std::function<bool()>& ready);
  bool IsOwnerThread() const { return std::this_thread::get_id() == owner_; }
  // Re-evaluates the waiters (a Generator's terminate_session was set).
  void Wake();
  // [owner] Delivers retained events (after a turn was cancelled).
  void DeliverRetained();
  // A Generator starts / stops using the shared engine (it is told about held logits after steps).
  void Attach(class Generator* generator);
  void Detach(class Generator* generator);

 private:
  struct Task {
    const std::function<void()>* work = nullptr;
    std::exception_ptr error;
    bool done = false;
  };

  explicit GeneratorHost(std::shared_ptr<Model> model);
  void Loop(std::shared_ptr<Model> model, std::promise<void>* started);
  // [owner] Runs the queued tasks; returns whether any ran.
  bool RunTasks();
  // [owner] Before a step: waits (at most a quarter of the last step) for the callers of the rows
  // the last step served to ask for their next token, so that the step takes them too.
  void GatherLateGrants();
  // [owner] Delivers the buffer's events to the Generators their rows belong to.
  void Deliver();

  std::shared_ptr<Engine> engine_;
  std::unique_ptr<OgaEngineEventBuffer> buffer_;
  std::thread thread_;
  std::thread::id owner_;
  std::mutex mutex_;
  std::condition_variable work_cv_;      // tasks arrived, or stop
  std::condition_variable progress_cv_;  // a task finished, events were delivered, or a wake
  std::deque<Task*> tasks_;              // guarded by mutex_
  bool stopping_ = false;                // guarded by mutex_
  std::vector<class Generator*> generators_;  // guarded by mutex_
  std::string failure_;                  // the engine's fatal error; guarded by mutex_
  // Owner thread only: the requests the last step gave a token to, and how long it took.
  std::vector<std::shared_ptr<Request>> last_served_;
  std::chrono::steady_clock::duration last_step_{};
};

}  // namespace oga
