// Engine creation: the block pool sized from the configuration or from the memory budget, the
// sliding-window ring and fixed-state pool geometry, and the executor's per-engine state.
#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "base/mix64.h"
#include "sampling/sampler.h"

namespace oga {
namespace {

std::atomic<uint64_t> g_next_engine_id{1};

// Vocabulary size from which a step's token selection is shared among RowWorkers.
constexpr size_t kParallelSelectionVocabulary = 4096;

constexpr const char* kBudgetTooSmallMessage = "The key-value cache budget is too small to hold the reserved decoder state.";

uint64_t SaturatingMultiply(uint64_t a, uint64_t b) {
  if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
  return a * b;
}

// Memory the KV cache may take on CPU: MemAvailable (reclaimable page cache included), or free
// physical pages where /proc/meminfo is missing.
uint64_t AvailableHostBytes() {
  if (std::FILE* meminfo = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (std::fgets(line, sizeof line, meminfo) != nullptr) {
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        found = true;
        break;
      }
    }
    std::fclose(meminfo);
    if (found) return SaturatingMultiply(static_cast<uint64_t>(kib), 1024);
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return SaturatingMultiply(static_cast<uint64_t>(pages), static_cast<uint64_t>(page_size));
}

// Free bytes of the memory the paged KV cache will live in: the executor's device when its
// OgaExtDeviceOps can tell, else host memory.
uint64_t AvailableCacheBytes(const OgaExtDeviceOps* device_ops) {
  if (device_ops == nullptr || device_ops->memory_info == nullptr) return AvailableHostBytes();
  size_t free_bytes = 0, total_bytes = 0;
  char message[512] = {};
  if (device_ops->memory_info(device_ops->context, &free_bytes, &total_bytes, message, sizeof(message)) != 0) {
    message[sizeof(message) - 1] = '\0';
    throw ApiError(std::string("Cannot size the KV cache from engine.dynamic_batching.gpu_utilization_factor: the "
                               "device's free memory is unknown (") + message + "). Set engine.dynamic_batching.num_blocks.");
  }
  return free_bytes;
}

// engine.dynamic_batching.gpu_utilization_factor without num_blocks: blocks that fit in 90% of the
// available memory times the factor (0.18's rule), but never more than max_batch_size requests of
// context_length tokens could occupy at once; `reserved_bytes` (the sliding-window ring pool and the
// fixed-state pool) comes off the budget first; the executor's bytes_per_block counts the
// full-attention layers only (seed: "Decoder state manifest").
uint64_t AutoSizedBlockCount(const ModelConfig& config, size_t bytes_per_block, double reserved_bytes,
                             uint64_t available_bytes) {
  const DynamicBatchingConfig& batching = *config.dynamic_batching;
  const double budget =
      static_cast<double>(available_bytes) * 0.9 * *batching.gpu_utilization_factor - reserved_bytes;
  const double fitting = std::floor(budget / static_cast<double>(bytes_per_block));
  if (!(fitting >= 1.0)) throw ApiError(kBudgetTooSmallMessage);
  const uint64_t block_size = static_cast<uint64_t>(batching.block_size);
  const uint64_t blocks_per_request = (static_cast<uint64_t>(config.context_length) + block_size - 1) / block_size;
  const uint64_t usable = SaturatingMultiply(static_cast<uint64_t>(batching.max_batch_size), blocks_per_request);
  uint64_t num_blocks = fitting >= static_cast<double>(usable) ? usable : static_cast<uint64_t>(fitting);
  // Block ids are int32 on the executor interface.
  num_blocks = std::min<uint64_t>(num_blocks, static_cast<uint64_t>(INT32_MAX) / std::max<uint64_t>(block_size, 1));
  return std::max<uint64_t>(num_blocks, 1);
}

// Sliding-window ring (seed: "Sliding-window paged layers"): when the decoder takes
// block_table_windowed for its model.decoder.sliding_window layers, the ring blocks R each request
// gets, R = ceil((C + W - 1) / B); 0 without a ring. Checks the enabling conditions (0.18's texts).
size_t RingBlocksFor(const ModelConfig& config, const OgaExtModelExecutor& executor, uint64_t block_size) {
  if (executor.windowed_block_table == 0) return 0;
  const DecoderConfig& decoder = config.decoder;
  if (!decoder.sliding_window || decoder.sliding_window->layers.empty()) {
    throw ApiError("The decoder takes " + decoder.inputs.block_table_windowed +
                   ", but model.decoder.sliding_window names no layers to keep in a ring.");
  }
  if (config.search.chunk_size <= 0) {
    throw ApiError(
        "This model holds its sliding-window layers in a ring of blocks, which only works if the prefill is chunked. "
        "Set search.chunk_size in genai_config.json.");
  }
  size_t full_layers = 0;
  for (const StateGroup& group : decoder.effective_state_groups) {
    if (group.kind != StateGroupKind::kPagedKv) continue;
    for (int32_t layer : group.layer_ids) {
      const std::vector<int32_t>& ring = decoder.sliding_window->layers;
      if (std::find(ring.begin(), ring.end(), layer) == ring.end()) ++full_layers;
    }
  }
  if (full_layers == 0) throw ApiError("A paged model needs at least one layer that keeps the whole sequence.");
  if (config.dynamic_batching->prefix_caching.value_or(false)) {
    throw ApiError("Prefix caching does not yet support sliding-window paged KV rings.");  // 0.18's text
  }
  const uint64_t chunk = static_cast<uint64_t>(config.search.chunk_size);
  const uint64_t window = static_cast<uint64_t>(decoder.sliding_window->window_size);
  return static_cast<size_t>((chunk + window - 1 + block_size - 1) / block_size);
}

// Fixed decoder state (hybrid models; seed: "Fixed request-state pools"): the per-tensor row bytes
// the executor reports, checked against the bindings the configuration's fixed groups declare.
// `static_fixed_state`: the static path may run them (EngineSizing::static_fixed_state).
std::vector<size_t> FixedStateRowBytes(const ModelConfig& config, const OgaExtModelExecutor& executor,
                                       bool static_fixed_state = false) {
  size_t declared = 0;
  for (const StateGroup& group : config.decoder.effective_state_groups) {
    if (group.kind != StateGroupKind::kPagedKv) declared += group.layer_ids.size();
  }
  if (declared == 0 && executor.num_fixed_states == 0) return {};
  if (declared > 0 && !config.dynamic_batching && !static_fixed_state) {
    throw ApiError("Fixed decoder state groups require engine.dynamic_batching");
  }
  if (executor.num_fixed_states != declared || (declared > 0 && executor.fixed_state_row_bytes == nullptr)) {
    throw ApiError("model.decoder.state_groups declares " + std::to_string(declared) +
                   " fixed state bindings, but the model executor binds " + std::to_string(executor.num_fixed_states) +
                   " fixed state tensors.");
  }
  std::vector<size_t> row_bytes(executor.fixed_state_row_bytes, executor.fixed_state_row_bytes + declared);
  for (size_t bytes : row_bytes) {
    if (bytes == 0) throw ApiError("A fixed decoder state tensor has an empty per-request row.");
  }
  return row_bytes;
}

// The scheduler's limits of a dynamic engine: the batch and step budgets, the block-table width
// (`table_columns`, capped by the executor's), windows, prefix caching, preemption, CUDA graphs and
// drafts. `fixed_pool` is the hybrid model's fixed-state pool (null for none); `fixed_state` says
// whether the model has fixed state, `fixed_capture` whether its executor captures it per token.
SchedulerLimits DynamicLimits(const ModelConfig& config, const DynamicBatchingConfig& batching,
                              const OgaExtModelExecutor& executor, size_t max_batch_size, size_t table_columns,
                              size_t ring_blocks, const FixedStatePool* fixed_pool, bool fixed_state,
                              bool fixed_capture) {
  SchedulerLimits limits;
  limits.max_batch_size = max_batch_size;
  limits.max_scheduled_tokens = static_cast<size_t>(batching.max_scheduled_tokens);
  const size_t executor_columns = executor.max_block_table_columns;
  limits.max_block_table_columns = executor_columns > 0 ? std::min(table_columns, executor_columns) : table_columns;
  if (ring_blocks > 0) limits.max_query_tokens = static_cast<size_t>(config.search.chunk_size);
  limits.prefix_caching = ring_blocks == 0 && batching.prefix_caching.value_or(true);
  limits.preemption = batching.preemption == DynamicBatchingConfig::Preemption::Recompute;
  limits.window_ring_blocks = ring_blocks;
  if (fixed_pool) limits.fixed_state_row_bytes = fixed_pool->total_row_bytes();
  // CUDA graphs for pure-decode steps; fixed-state bindings change every step, so hybrid models run
  // eagerly.
  limits.graph_capture = executor.cuda_graph != 0 && !fixed_pool;
  // Drafts need one logits row per packed token, and room for them beside the mandatory token; a
  // hybrid model also needs every token's fixed state to replay a partially accepted proposal.
  if (executor.per_token_logits != 0 && limits.max_scheduled_tokens > 1 &&
      (!fixed_state || fixed_capture)) {
    limits.max_draft_tokens = std::min(kMaxDraftTokens, limits.max_scheduled_tokens - 1);
    if (limits.max_query_tokens > 0) {
      limits.max_draft_tokens = std::min(limits.max_draft_tokens, limits.max_query_tokens - 1);
    }
  }
  return limits;
}

}  // namespace

std::shared_ptr<Engine> Engine::Create(std::shared_ptr<Model> model, const EngineSizing& sizing) {
  const ModelConfig& config = model->config();
  if (!config.dynamic_batching) return CreateStatic(std::move(model), sizing);
  const DynamicBatchingConfig& batching = *config.dynamic_batching;
  const size_t max_batch_size = std::max(static_cast<size_t>(batching.max_batch_size), sizing.min_batch_size);
  if (!batching.num_blocks) {
    if (!batching.gpu_utilization_factor) throw ApiError(kBudgetTooSmallMessage);
    if (model->executor().bytes_per_block == 0) {
      throw ApiError(
          "Automatic KV-cache sizing from engine.dynamic_batching.gpu_utilization_factor is not supported yet by oga; "
          "set engine.dynamic_batching.num_blocks.");
    }
  }
  if (config.vocab_size < 1) throw ApiError("vocab_size must be 1 or greater, is " + std::to_string(config.vocab_size));
  if (config.context_length < 1) throw ApiError("context_length must be > 0");
  const uint64_t block_size = static_cast<uint64_t>(batching.block_size);
  const size_t ring_blocks = RingBlocksFor(config, model->executor(), block_size);
  const std::vector<size_t> fixed_row_bytes = FixedStateRowBytes(config, model->executor());
  const bool fixed_capture = !fixed_row_bytes.empty() && model->executor().fixed_state_capture != 0;
  // The memory the automatic size divides, measured before the fixed-state pool takes its share
  // (which is then subtracted once, below).
  const bool auto_sized = !batching.num_blocks;
  const uint64_t available_bytes = auto_sized ? AvailableCacheBytes(model->executor().device_ops) : 0;
  // The pool is allocated before the blocks are sized, so a planned step never fails for its memory.
  std::unique_ptr<FixedStatePool> fixed_pool;
  if (!fixed_row_bytes.empty()) {
    try {
      // With prefix caching, max_batch_size fixed-state checkpoints (as 0.18 keeps).
      const bool checkpoints = ring_blocks == 0 && batching.prefix_caching.value_or(true);
      const size_t slots = max_batch_size;
      fixed_pool = std::make_unique<FixedStatePool>(
          fixed_row_bytes, slots, static_cast<size_t>(batching.max_scheduled_tokens), fixed_capture, model->faults(),
          checkpoints ? slots : 0, model->executor().device_ops);
    } catch (const std::bad_alloc&) {
      throw ApiError(kBudgetTooSmallMessage);
    }
  }
  // The ring pool (one ring per block table) and the fixed-state pool are fixed costs the
  // automatic size leaves room for.
  const double ring_bytes = static_cast<double>(ring_blocks) * static_cast<double>(max_batch_size) *
                                static_cast<double>(model->executor().bytes_per_window_block) +
                            (fixed_pool ? static_cast<double>(fixed_pool->persistent_bytes()) : 0.0);
  uint64_t num_blocks = auto_sized ? AutoSizedBlockCount(config, model->executor().bytes_per_block, ring_bytes,
                                                         available_bytes)
                                   : static_cast<uint64_t>(*batching.num_blocks);
  if (sizing.max_blocks > 0) num_blocks = std::min<uint64_t>(num_blocks, sizing.max_blocks);
  if (num_blocks > static_cast<uint64_t>(INT32_MAX) || block_size > static_cast<uint64_t>(INT32_MAX)) {
    throw ApiError("engine.dynamic_batching.num_blocks and block_size must fit in int32.");
  }
  // The final sampled token never needs a KV slot, hence + 1.
  const uint64_t max_request_length = std::min<uint64_t>(static_cast<uint64_t>(config.context_length),
                                                         num_blocks * block_size + 1);
  const size_t table_columns = static_cast<size_t>((max_request_length + block_size - 1) / block_size);
  const SchedulerLimits limits = DynamicLimits(config, batching, model->executor(), max_batch_size, table_columns,
                                               ring_blocks, fixed_pool.get(), !fixed_row_bytes.empty(), fixed_capture);

  std::shared_ptr<Engine> engine(new Engine(std::move(model), limits, static_cast<size_t>(block_size),
                                            static_cast<size_t>(num_blocks), max_request_length,
                                            sizing.selection_participants));
  OgaExtEngineGeometry geometry{};
  geometry.block_size = static_cast<size_t>(block_size);
  geometry.num_blocks = static_cast<size_t>(num_blocks);
  geometry.max_batch_size = limits.max_batch_size;
  geometry.max_scheduled_tokens = limits.max_scheduled_tokens;
  geometry.max_block_table_columns = table_columns;
  geometry.vocab_size = engine->vocab_size_;
  geometry.window_ring_blocks = ring_blocks;
  geometry.window_blocks = ring_blocks * limits.max_batch_size;  // one fixed ring per block table
  if (fixed_pool) {
    geometry.fixed_state_slots = fixed_pool->capacity();
    if (limits.prefix_caching) fixed_pool->IndexCheckpointsOver(static_cast<size_t>(num_blocks));
    engine->cache_.EnableFixedState(std::move(fixed_pool));
    engine->hybrid_io_ = std::make_unique<HybridDecoderIO>(engine->io_);
  }
  engine->executor_.Open(engine->model_->executor(), geometry);
  return engine;
}

std::shared_ptr<Engine> Engine::CreateStatic(std::shared_ptr<Model> model, const EngineSizing& sizing) {
  const ModelConfig& config = model->config();
  // The static executor keeps the fixed state itself (one row per batch row, zeroed when a batch
  // is prefilled); the engine only checks that it binds what the configuration declares.
  const bool fixed_state = !FixedStateRowBytes(config, model->executor(), sizing.static_fixed_state).empty();
  if (model->executor().execute_static == nullptr) {
    throw ApiError("This model's executor has no static batching path; configure engine.dynamic_batching.");
  }
  if (config.search.chunk_size > 0) {
    throw ApiError("search.chunk_size requires dynamic batching; the static batch scheduler cannot chunk a prefill.");
  }
  if (config.vocab_size < 1) throw ApiError("vocab_size must be 1 or greater, is " + std::to_string(config.vocab_size));
  const int64_t max_length = sizing.static_max_length != 0 ? static_cast<int64_t>(sizing.static_max_length)
                             : config.search.max_length != 0 ? config.search.max_length
                                                             : config.context_length;
  if (max_length <= 0) {
    throw ApiError("The model's search.max_length must be greater than zero; actual value is " +
                   std::to_string(max_length));
  }
  SchedulerLimits limits;
  limits.max_batch_size = std::max(static_cast<size_t>(config.static_max_batch_size), sizing.min_batch_size);
  limits.max_scheduled_tokens = 1;  // the dynamic collaborators stay idle on this path
  limits.max_block_table_columns = 1;
  const size_t length = static_cast<size_t>(max_length);
  std::shared_ptr<Engine> engine(new Engine(std::move(model), limits, length, 0, length, sizing.selection_participants));
  engine->static_scheduler_ =
      std::make_unique<StaticBatchScheduler>(limits.max_batch_size, engine->model_->config().pad_token_id);
  engine->static_io_ = std::make_unique<StaticBatchDecoderIO>(limits.max_batch_size, length,
                                                              engine->model_->config().pad_token_id);
  engine->static_staged_.resize(limits.max_batch_size);
  engine->static_fixed_state_ = fixed_state;
  OgaExtEngineGeometry geometry{};
  geometry.max_batch_size = limits.max_batch_size;
  geometry.vocab_size = engine->vocab_size_;
  geometry.max_sequence_length = length;
  engine->executor_.Open(engine->model_->executor(), geometry);
  return engine;
}

Engine::Engine(std::shared_ptr<Model> model, const SchedulerLimits& limits, size_t block_size, size_t num_blocks,
               uint64_t max_request_length, size_t selection_participants)
    : model_(std::move(model)),
      id_(g_next_engine_id.fetch_add(1)),
      owner_(std::this_thread::get_id()),
      limits_(limits),
      max_request_length_(max_request_length),
      vocab_size_(static_cast<size_t>(model_->config().vocab_size)),
      seed_sequence_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()),
      cache_(block_size, num_blocks, limits.max_batch_size,
             static_cast<size_t>((max_request_length + block_size - 1) / block_size), limits.prefix_caching),
      scheduler_(limits, cache_),
      // Graph buckets stop at the widest table the executor takes (limits.max_block_table_columns).
      io_(limits.max_batch_size, limits.max_scheduled_tokens, limits.max_block_table_columns, limits.window_ring_blocks,
          limits.graph_capture),
      pending_(limits.max_batch_size * 8 + 1),
      // Small vocabularies select in microseconds: waking workers would cost more than it saves.
      selector_(vocab_size_, model_->config().eos_token_ids, limits.max_batch_size,
                vocab_size_ < kParallelSelectionVocabulary ? 1
                : selection_participants > 0 ? std::min(selection_participants, RowWorkers::DefaultParticipants())
                                             : RowWorkers::DefaultParticipants(),
                model_->executor().device_ops,
                model_->executor().per_token_logits != 0 ? std::max(limits.max_scheduled_tokens, limits.max_batch_size)
                                                         : limits.max_batch_size,
                counters_) {
  plan_.rows.reserve(limits.max_batch_size);
  plan_.publish_order.reserve(limits.max_batch_size);
  plan_.cached_block_ids.reserve(limits.max_batch_size * cache_.max_columns());
  plan_.unserviceable.reserve(limits.max_batch_size);
  staged_.resize(limits.max_batch_size);
}

Engine::~Engine() { Teardown(); }

void Engine::Teardown() noexcept {
  if (torn_down_) return;
  torn_down_ = true;
  cache_.Discard();
  if (static_scheduler_) static_scheduler_->Clear();
  for (const std::shared_ptr<Request>& request : bound_) {
    cache_.Release(*request);
    request->waiting = false;
    EndTurnState(*request);
    request->status = RequestStatus::Closed;
    request->Detach();
    std::vector<int32_t>().swap(request->tokens);
  }
  pending_.Clear();
  bound_.clear();
  executor_.Close();
}

void Engine::ThrowIfUnhealthy() const {
  if (unhealthy_) throw ApiError(fatal_message_);
}

}  // namespace oga
