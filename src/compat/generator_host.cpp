#include "compat/generator_host.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <utility>

#include "base/errors.h"
#include "request/events.h"
#include "compat/generator.h"

namespace oga {
namespace {

// One host per model, while any Generator uses it. The host owns the engine, which keeps the
// model alive, so a key is never reused while its entry lives.
std::mutex g_hosts_mutex;
std::map<const Model*, std::weak_ptr<GeneratorHost>> g_hosts;

}  // namespace

std::shared_ptr<GeneratorHost> GeneratorHost::Of(const std::shared_ptr<Model>& model) {
  const ModelConfig& config = model->config();
  if (!config.dynamic_batching) {
    throw ApiError("engine.shared_generators needs engine.dynamic_batching: a static batch cannot take a Generator's "
                   "rows while others run.");
  }
  if (config.dynamic_batching->preemption == DynamicBatchingConfig::Preemption::None) {
    throw ApiError("engine.shared_generators needs engine.dynamic_batching.preemption \"recompute\": Generators "
                   "waiting for their callers hold their rows, which only preemption can make room around.");
  }
  std::lock_guard<std::mutex> lock(g_hosts_mutex);
  std::weak_ptr<GeneratorHost>& slot = g_hosts[model.get()];
  if (std::shared_ptr<GeneratorHost> host = slot.lock()) return host;
  std::shared_ptr<GeneratorHost> host(new GeneratorHost(model));
  slot = host;
  return host;
}

GeneratorHost::GeneratorHost(std::shared_ptr<Model> model) {
  std::promise<void> started;
  std::future<void> ready = started.get_future();
  thread_ = std::thread(&GeneratorHost::Loop, this, std::move(model), &started);
  try {
    ready.get();  // the engine exists (or its creation failed) before the host is handed out
  } catch (...) {
    thread_.join();
    throw;
  }
}

GeneratorHost::~GeneratorHost() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!engine_) return;
  std::lock_guard<std::mutex> lock(g_hosts_mutex);
  auto entry = g_hosts.find(&engine_->model());
  if (entry != g_hosts.end() && entry->second.expired()) g_hosts.erase(entry);  // a newer host keeps it
}

void GeneratorHost::Loop(std::shared_ptr<Model> model, std::promise<void>* started) {
  try {
    engine_ = Engine::Create(std::move(model));
    buffer_ = std::make_unique<OgaEngineEventBuffer>(engine_->id(), engine_->max_batch_size() * 2 + 8);
    owner_ = std::this_thread::get_id();
  } catch (...) {
    started->set_exception(std::current_exception());
    return;
  }
  started->set_value();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [this] {
        return stopping_ || !tasks_.empty() || (failure_.empty() && engine_->HasPendingRequests());
      });
      if (stopping_) break;
    }
    if (RunTasks()) continue;  // the tasks may have changed what is schedulable
    GatherLateGrants();
    const uint64_t committed = engine_->counters().committed_steps;
    const auto step_start = std::chrono::steady_clock::now();
    try {
      engine_->Run(*buffer_);
    } catch (const std::exception& error) {
      std::lock_guard<std::mutex> lock(mutex_);
      failure_ = error.what();
    }
    last_step_ = std::chrono::steady_clock::now() - step_start;
    Deliver();
    bool blocked = false;
    for (size_t i = 0; i < buffer_->count; ++i) {
      blocked = blocked || (buffer_->slots[i].flags & OgaEngineEventFlag_CapacityBlocked) != 0;
    }
    if (blocked && engine_->counters().committed_steps == committed) {
      // Nothing fits and no resident can be preempted: only a Generator's next call (a grant, a
      // close) can change that, so wait for one instead of stepping again.
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    }
  }
  engine_->Teardown();
}

void GeneratorHost::GatherLateGrants() {
  // The rows that got a token in the last step are paused until their callers ask for the next
  // one, which takes a thread wake-up and the interpreter lock. Stepping at once would leave them
  // out of this step and batch them into the next one alone; waiting a fraction of a step for
  // them keeps the batch whole (a Generator that stopped asking costs at most that wait, once).
  const auto deadline = std::chrono::steady_clock::now() + last_step_ / 4;
  for (;;) {
    bool waiting_for_grant = false;
    for (const std::shared_ptr<Request>& request : last_served_) {
      if (request->paced && request->allowance == 0 && !request->hold_logits && !request->logits_held &&
          request->executable() && request->generator_row != nullptr) {
        waiting_for_grant = true;
        break;
      }
    }
    if (!waiting_for_grant) break;
    std::unique_lock<std::mutex> lock(mutex_);
    if (!work_cv_.wait_until(lock, deadline, [this] { return stopping_ || !tasks_.empty(); })) break;
    if (stopping_) break;
    lock.unlock();
    RunTasks();
  }
  last_served_.clear();
}

bool GeneratorHost::RunTasks() {
  std::deque<Task*> tasks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks.swap(tasks_);
  }
  for (Task* task : tasks) {
    try {
      (*task->work)();
    } catch (...) {
      task->error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    task->done = true;
  }
  if (!tasks.empty()) progress_cv_.notify_all();
  return !tasks.empty();
}

void GeneratorHost::Deliver() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < buffer_->count; ++i) {
      const EngineEvent& event = buffer_->slots[i];
      if (!event.request || event.request->generator_row == nullptr) continue;
      event.request->generator_row->owner->Dispatch(event);
      if (event.flags & OgaEngineEventFlag_Token) last_served_.push_back(event.request);
    }
    for (Generator* generator : generators_) generator->RefreshHeldLogits();
    if (failure_.empty() && !engine_->healthy()) failure_ = engine_->fatal_message();
  }
  progress_cv_.notify_all();
}

void GeneratorHost::DeliverRetained() {
  while (engine_->retained_event_count() > 0) {
    engine_->Run(*buffer_);
    Deliver();
  }
}

void GeneratorHost::Call(const std::function<void()>& work) {
  if (std::this_thread::get_id() == owner_) {
    work();
    return;
  }
  Task task;
  task.work = &work;
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) throw ApiError("The shared Generator engine is shutting down.");
  tasks_.push_back(&task);
  work_cv_.notify_all();
  progress_cv_.wait(lock, [&task] { return task.done; });
  lock.unlock();
  if (task.error) std::rethrow_exception(task.error);
}

void GeneratorHost::WaitFor(const std::function<bool()>& ready) {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_cv_.wait(lock, [&] { return !failure_.empty() || ready(); });
  if (!failure_.empty() && !ready()) throw ApiError(failure_);
}

void GeneratorHost::Attach(Generator* generator) {
  std::lock_guard<std::mutex> lock(mutex_);
  generators_.push_back(generator);
}

void GeneratorHost::Detach(Generator* generator) {
  std::lock_guard<std::mutex> lock(mutex_);
  generators_.erase(std::remove(generators_.begin(), generators_.end(), generator), generators_.end());
}

void GeneratorHost::Wake() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  progress_cv_.notify_all();
}

}  // namespace oga
