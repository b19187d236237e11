#include "engine.h"

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

#include "mix64.h"
#include "sampler.h"

namespace oga {
namespace {

std::atomic<uint64_t> g_next_engine_id{1};

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

OgaTurnUsage UsageOf(const Request& request) {
  OgaTurnUsage usage;
  usage.prompt_tokens = request.turn_prompt_tokens;
  usage.generated_tokens = request.turn_generated_tokens;
  usage.cached_prompt_tokens = request.turn_cached_tokens;
  return usage;
}

// A logits row as float32 (float16 rows are widened).
void CopyLogitsRow(const LogitsRow& row, size_t vocab_size, float* out) {
  if (row.type == OgaExtLogitsType_Float16) {
    const uint16_t* half = static_cast<const uint16_t*>(row.data);
    for (size_t i = 0; i < vocab_size; ++i) out[i] = HalfToFloat(half[i]);
  } else {
    std::memcpy(out, row.data, vocab_size * sizeof(float));
  }
}

std::string NotSupportedYet(const char* what) {
  return std::string(what) + " is not supported yet by oga. Remove it from the turn options.";
}

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
std::vector<size_t> FixedStateRowBytes(const ModelConfig& config, const OgaExtModelExecutor& executor) {
  size_t declared = 0;
  for (const StateGroup& group : config.decoder.effective_state_groups) {
    if (group.kind != StateGroupKind::kPagedKv) declared += group.layer_ids.size();
  }
  if (declared == 0 && executor.num_fixed_states == 0) return {};
  if (declared > 0 && !config.dynamic_batching) throw ApiError("Fixed decoder state groups require engine.dynamic_batching");
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
  SchedulerLimits limits;
  limits.max_batch_size = max_batch_size;
  limits.max_scheduled_tokens = static_cast<size_t>(batching.max_scheduled_tokens);
  const size_t table_columns = static_cast<size_t>((max_request_length + block_size - 1) / block_size);
  const size_t executor_columns = model->executor().max_block_table_columns;
  limits.max_block_table_columns = executor_columns > 0 ? std::min(table_columns, executor_columns) : table_columns;
  if (ring_blocks > 0) limits.max_query_tokens = static_cast<size_t>(config.search.chunk_size);
  limits.prefix_caching = ring_blocks == 0 && batching.prefix_caching.value_or(true);
  limits.preemption = batching.preemption == DynamicBatchingConfig::Preemption::Recompute;
  limits.window_ring_blocks = ring_blocks;
  if (fixed_pool) limits.fixed_state_row_bytes = fixed_pool->total_row_bytes();
  // CUDA graphs for pure-decode steps; fixed-state bindings change every step, so hybrid models run
  // eagerly.
  limits.graph_capture = model->executor().cuda_graph != 0 && !fixed_pool;
  // Drafts need one logits row per packed token, and room for them beside the mandatory token; a
  // hybrid model also needs every token's fixed state to replay a partially accepted proposal.
  if (model->executor().per_token_logits != 0 && limits.max_scheduled_tokens > 1 &&
      (fixed_row_bytes.empty() || fixed_capture)) {
    limits.max_draft_tokens = std::min(kMaxDraftTokens, limits.max_scheduled_tokens - 1);
    if (limits.max_query_tokens > 0) {
      limits.max_draft_tokens = std::min(limits.max_draft_tokens, limits.max_query_tokens - 1);
    }
  }

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
  if (!FixedStateRowBytes(config, model->executor()).empty()) {
    throw ApiError("Fixed decoder state groups require engine.dynamic_batching");
  }
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
      eos_ids_(model_->config().eos_token_ids),
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
      workers_(vocab_size_ < kParallelSelectionVocabulary ? 1
               : selection_participants > 0    ? std::min(selection_participants, RowWorkers::DefaultParticipants())
                                               : RowWorkers::DefaultParticipants()) {
  scratches_.reserve(workers_.participants());
  for (size_t p = 0; p < workers_.participants(); ++p) scratches_.emplace_back(vocab_size_);
  stop_scratches_.resize(workers_.participants());
  select_requests_.resize(limits.max_batch_size);
  select_logits_rows_.resize(limits.max_batch_size);
  select_staged_.resize(limits.max_batch_size);
  select_rows_.resize(limits.max_batch_size);
  plan_.rows.reserve(limits.max_batch_size);
  plan_.publish_order.reserve(limits.max_batch_size);
  plan_.cached_block_ids.reserve(limits.max_batch_size * cache_.max_columns());
  plan_.unserviceable.reserve(limits.max_batch_size);
  staged_.resize(limits.max_batch_size);
  const OgaExtDeviceOps* device_ops = model_->executor().device_ops;
  if (DeviceLogits::Supported(device_ops)) {
    const size_t logits_rows = model_->executor().per_token_logits != 0
                                   ? std::max(limits.max_scheduled_tokens, limits.max_batch_size)
                                   : limits.max_batch_size;
    device_logits_ = std::make_unique<DeviceLogits>(device_ops, limits.max_batch_size, logits_rows, vocab_size_);
    device_select_.reserve(limits.max_batch_size);
    host_select_.reserve(limits.max_batch_size);
  }
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

std::shared_ptr<Request> Engine::CreateRequest(const OgaRequestOptions* options, const SearchConfig& search) {
  CheckOwnerThread();
  ThrowIfUnhealthy();
  ReclaimAbandoned();
  if (search.num_beams != 1) {
    throw ApiError("The model configures search.num_beams = " + std::to_string(search.num_beams) +
                   ", and beam search is not supported by the Engine; every Engine Request decodes one sequence with "
                   "one beam. Clear it on the Config before creating the model -- OgaConfigOverlay(config, "
                   "\"{\\\"search\\\":{\\\"num_beams\\\":1}}\"), or in Python config.overlay('{\"search\": "
                   "{\"num_beams\": 1}}') -- and batch across Requests instead.");
  }
  if (search.min_length != 0) {
    throw ApiError("The model configures a nonzero search.min_length (" + std::to_string(search.min_length) +
                   "), which is a session-absolute floor the Engine does not support; its minimum is per turn. Clear "
                   "it on the Config before creating the model -- OgaConfigOverlay(config, "
                   "\"{\\\"search\\\":{\\\"min_length\\\":0}}\"), or in Python config.overlay('{\"search\": "
                   "{\"min_length\": 0}}') -- and use OgaTurnOptionsSetMinGeneratedTokens for a per-turn minimum "
                   "instead.");
  }
  const int64_t max_length = search.max_length != 0 ? search.max_length : model_->config().context_length;
  if (max_length <= 0) {
    throw ApiError("The model's search.max_length must be greater than zero; actual value is " +
                   std::to_string(max_length));
  }
  uint64_t max_session_tokens = std::min<uint64_t>(static_cast<uint64_t>(max_length), max_request_length_);
  if (static_batching() && options != nullptr && options->max_session_tokens > max_request_length_) {
    // The static path bounds a request by the contiguous cache it is allocated with.
    throw ApiError("max_session_tokens (" + std::to_string(options->max_session_tokens) +
                   ") must be greater than zero and no greater than the model-configured search.max_length (" +
                   std::to_string(max_request_length_) + ").");
  }
  if (options != nullptr && options->max_session_tokens != 0) {
    if (options->max_session_tokens > max_request_length_) {
      throw ApiError("max_session_tokens (" + std::to_string(options->max_session_tokens) +
                     ") must be greater than zero and no greater than the Engine's max_request_length (" +
                     std::to_string(max_request_length_) + ").");
    }
    max_session_tokens = options->max_session_tokens;
  }
  bound_.reserve(bound_.size() + 1);
  // The request's durable seed basis: search.random_seed, else the next value of the engine's
  // splitmix64 sequence (seeded once from the OS: a random_device draw costs ~20 us per request).
  const uint64_t seed = search.random_seed ? *search.random_seed
                                           : Mix64(seed_sequence_ += 0x9E3779B97F4A7C15ull);
  auto request = std::make_shared<Request>(this, next_request_serial_++, max_session_tokens, search);
  request->stream.Seed(seed);
  bound_.push_back(request);
  return request;
}

TurnPolicy Engine::ResolveTurnPolicy(const Request& request, const TurnOptionValues* values,
                                     uint64_t sequence_after) const {
  if (values != nullptr && static_batching()) {
    // What the static path can never do, in 0.18's words (before anything not supported yet).
    if (!values->stop_strings.empty()) throw ApiError("Stop strings require an Engine configured for dynamic batching.");
    if (values->seed) throw ApiError("A per-turn seed requires an Engine configured for dynamic batching.");
    if (values->delimited_opening_token) {
      throw ApiError("Delimited guidance requires an Engine configured for dynamic batching.");
    }
  }
  TurnPolicy policy = oga::ResolveTurnPolicy(request.search, values, vocab_size_);
  if (values != nullptr && values->delimited_opening_token) {
    throw ApiError(NotSupportedYet("Delimited guidance (OgaTurnOptionsSetDelimitedGuidance)"));
  }
  if (policy.max_generated_tokens != 0 && policy.min_generated_tokens > policy.max_generated_tokens) {
    throw ApiError("min_generated_tokens (" + std::to_string(policy.min_generated_tokens) +
                   ") must not exceed max_generated_tokens (" + std::to_string(policy.max_generated_tokens) + ").");
  }
  if (policy.min_generated_tokens > request.max_session_tokens - sequence_after) {
    throw ApiError("min_generated_tokens (" + std::to_string(policy.min_generated_tokens) +
                   ") does not fit between the turn's prompt length (" + std::to_string(sequence_after) +
                   ") and max_session_tokens (" + std::to_string(request.max_session_tokens) + ").");
  }
  return policy;
}

uint64_t Engine::BeginTurn(Request& request, const OgaTurnOptions* options, const int32_t* input_ids, uint64_t count) {
  CheckOwnerThread();
  CheckNoStepInFlight("begin a turn");
  ThrowIfUnhealthy();
  ReclaimAbandoned();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (options != nullptr) {
    std::shared_ptr<Request> bound = options->request.lock();
    if (bound.get() != &request) throw ApiError("Turn options belong to a different or destroyed Request.");
  }
  return BeginTurnWith(request, options != nullptr ? &options->values : nullptr, input_ids, count);
}

uint64_t Engine::BeginTurnWith(Request& request, const TurnOptionValues* values, const int32_t* input_ids,
                               uint64_t count) {
  CheckOwnerThread();
  CheckNoStepInFlight("begin a turn");
  ThrowIfUnhealthy();
  ReclaimAbandoned();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (request.executable()) {
    throw ApiError("BeginTurn is only valid for a new request or after the current turn is complete.");
  }
  const bool continuation = request.status == RequestStatus::TurnComplete;
  if (continuation) {
    if (request.retained_events > 0) {
      throw ApiError(
          "Cannot continue a request while an Engine event is pending; call Engine::Run() to drain the event before "
          "continuing.");
    }
    if (request.finish_reason == OgaFinishReason_Failed) throw ApiError("Cannot continue a Request whose current turn failed.");
    if (request.processed > 0 && !request.resident()) {
      throw ApiError("Cannot continue a request whose model state is no longer resident.");
    }
    if (static_batching() && request.static_row >= 0 && static_scheduler_->rows().size() != 1) {
      throw ApiError("Continuous decoding requires exactly one resident request in a static engine batch; actual "
                     "resident request count is " + std::to_string(static_scheduler_->rows().size()) + ".");
    }
  }
  if (count == 0) throw ApiError("Expected at least one input token for generation. Received 0.");
  for (uint64_t i = 0; i < count; ++i) {
    if (input_ids[i] < 0 || static_cast<size_t>(input_ids[i]) >= vocab_size_) {
      throw ApiError("input_ids[" + std::to_string(i) + "] (" + std::to_string(input_ids[i]) +
                     ") is outside the model's vocabulary [0, " + std::to_string(vocab_size_) + ").");
    }
  }
  const uint64_t current = request.tokens.size();
  if (count >= request.max_session_tokens || current >= request.max_session_tokens - count) {
    throw ApiError("Appending input_tokens_count (" + std::to_string(count) + ") to current_sequence_length (" +
                   std::to_string(current) + ") must leave room for at least one generated token before "
                   "max_session_tokens (" + std::to_string(request.max_session_tokens) + ").");
  }
  const TurnPolicy policy = ResolveTurnPolicy(request, values, current + count);
  if (request.turn_id == UINT64_MAX) {
    throw ApiError("The request cannot admit another turn because its uint64 turn id space is exhausted.");
  }
  // The turn's text state: the tokenizer is loaded and the grammar compiled here, so a bad grammar
  // or a missing tokenizer is this call's error.
  StopStringMatcher stop;
  std::unique_ptr<GuidanceCursor> guidance;
  if (values != nullptr && !values->stop_strings.empty()) {
    stop.Reset(values->stop_strings, model_->token_table());
    for (std::string& scratch : stop_scratches_) scratch.reserve(stop.scratch_capacity(kMaxTokensPerStep));
  }
  if (values != nullptr && !values->guidance_type.empty()) {
    guidance = std::make_unique<GuidanceCursor>(model_->guidance_tokenizer(), values->guidance_type,
                                                values->guidance_data);
  }
  failed_rows_.reserve(limits_.max_batch_size);
  // Everything that can fail happens before the first mutation.
  // Room for the input and the first generated token; StageResults grows it (fallibly, before
  // commit) so publication never allocates.
  request.tokens.reserve(current + count + 1);
  request.turn_starts.reserve(request.turn_starts.size() + 1);
  const bool enqueue = !request.resident() && !request.waiting;
  if (enqueue) ReserveWaitingSlot();

  request.tokens.insert(request.tokens.end(), input_ids, input_ids + count);
  request.turn_id += 1;
  request.turn_starts.emplace_back(request.turn_id, current);
  request.turn_prompt_tokens = count;
  request.turn_generated_tokens = 0;
  request.turn_cached_tokens = 0;
  request.finish_reason = OgaFinishReason_None;
  request.policy = policy;
  request.stop = std::move(stop);
  request.guidance = std::move(guidance);
  request.status = RequestStatus::Assigned;
  if (enqueue) EnqueueWaiting(request);
  return request.turn_id;
}

bool Engine::CancelTurn(Request& request, uint64_t turn_id) {
  CheckOwnerThread();
  CheckNoStepInFlight("cancel a turn");
  if (request.turn_id == 0) throw ApiError("Cannot cancel a request before a turn has begun.");
  if (turn_id != request.turn_id || !request.executable()) return false;
  RemoveWaiting(request);
  PublishTerminal(request, OgaFinishReason_Cancelled, OgaErrorCode_None);
  return true;
}

void Engine::RewindToStartOfTurn(Request& request, uint64_t turn_id) {
  CheckOwnerThread();
  CheckNoStepInFlight("rewind a request");
  ReclaimAbandoned();
  if (request.closed()) throw ApiError("Cannot rewind a closed request.");
  if (request.status != RequestStatus::TurnComplete) {
    throw ApiError("Request rewind is only valid after the current turn is complete.");
  }
  if (request.retained_events > 0) {
    throw ApiError(
        "Cannot rewind a request while an Engine event is pending; call Engine::Run() to drain the event before "
        "rewinding.");
  }
  if (request.finish_reason == OgaFinishReason_Failed) throw ApiError("Cannot rewind a Request whose current turn failed.");
  // 0.18 checks residency (and the static batch's row count) before it looks the turn id up.
  if (request.processed > 0 && !request.resident()) {
    throw ApiError("Cannot rewind a request whose model state is no longer resident.");
  }
  if (static_batching() && request.static_row >= 0 && static_scheduler_->rows().size() != 1) {
    throw ApiError(
        "Static Engine Request rewind requires exactly one resident Request because a row cannot be released "
        "independently from its shared contiguous cache allocation.");
  }
  auto start = std::find_if(request.turn_starts.begin(), request.turn_starts.end(),
                            [turn_id](const std::pair<uint64_t, size_t>& entry) { return entry.first == turn_id; });
  if (turn_id == 0 || start == request.turn_starts.end()) {
    throw ApiError("Cannot rewind to unknown Turn ID " + std::to_string(turn_id) + ".");
  }
  Truncate(request, start->second);
}

void Engine::TruncateRequest(Request& request, size_t length) {
  CheckOwnerThread();
  CheckNoStepInFlight("truncate a request");
  ReclaimAbandoned();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (request.executable()) throw ApiError("A request can only be truncated between turns.");
  if (request.retained_events > 0) {
    throw ApiError("Cannot truncate a request while an Engine event is pending; call Engine::Run() to drain it first.");
  }
  if (length > request.tokens.size()) {
    throw ApiError("Cannot truncate a request of " + std::to_string(request.tokens.size()) + " tokens to " +
                   std::to_string(length) + ".");
  }
  if (static_batching() && request.static_row >= 0 && static_scheduler_->rows().size() != 1) {
    throw ApiError(
        "Static Engine Request rewind requires exactly one resident Request because a row cannot be released "
        "independently from its shared contiguous cache allocation.");
  }
  Truncate(request, length);
}

void Engine::Truncate(Request& request, size_t boundary) {
  // No allocation from here on: shrinking keeps capacity.
  request.tokens.resize(boundary);
  request.processed = std::min(request.processed, boundary);
  request.recompute_until = std::min(request.recompute_until, boundary);
  // Turns that began at or after the boundary are gone (turns start at strictly increasing lengths).
  auto first_gone = std::find_if(request.turn_starts.begin(), request.turn_starts.end(),
                                 [boundary](const std::pair<uint64_t, size_t>& entry) { return entry.second >= boundary; });
  request.turn_starts.erase(first_gone, request.turn_starts.end());
  if (static_batching()) {
    // The row's contiguous cache keeps its first `processed` positions; later ones are rewritten.
    for (StaticRow& row : static_scheduler_->rows()) {
      if (row.request.get() == &request) row.processed = request.processed;
    }
  } else {
    // As 0.18: the rewound request gives its blocks and its residency back, and its next turn
    // prefills the retained history again (admitted like a first turn; with prefix caching its full
    // blocks are adopted from the index instead of computed).
    scheduler_.Remove(request);
    cache_.Release(request);
    request.processed = 0;
  }
}

void Engine::AllowTokens(Request& request, uint32_t tokens) {
  CheckOwnerThread();
  CheckNoStepInFlight("pace a request");
  request.paced = true;
  request.allowance = tokens;
}

void Engine::HoldLogits(Request& request) {
  CheckOwnerThread();
  CheckNoStepInFlight("hold a request's logits");
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (!request.executable()) throw ApiError("Logits can only be held for a request whose turn is running.");
  if (request.logits_held) return;
  request.held_logits.resize(vocab_size_);  // before the flag: a failed allocation changes nothing
  request.hold_logits = true;
}

void Engine::SelectHeldToken(Request& request) {
  CheckOwnerThread();
  CheckNoStepInFlight("select a held token");
  ThrowIfUnhealthy();
  if (request.closed()) throw ApiError(kClosedRequestMessage);
  if (!request.logits_held || request.status != RequestStatus::Active) {
    throw ApiError("The request holds no logits to select a token from.");
  }
  LogitsRow logits;
  logits.data = request.held_logits.data();
  logits.type = OgaExtLogitsType_Float32;
  StagedResult staged;
  try {
    staged = SelectFromLogits(request, logits, 0);
  } catch (const RetryableStepError&) {
    throw ApiError("No token can be selected: every logit is NaN or masked.");
  }
  request.logits_held = false;
  PublishToken(request, staged);
}

void Engine::ReserveWaitingSlot() {
  if (static_batching()) {
    static_scheduler_->ReserveWaitingSlot();
  } else {
    scheduler_.ReserveWaitingSlot();
  }
}

void Engine::EnqueueWaiting(Request& request) {
  if (static_batching()) {
    static_scheduler_->Enqueue(request);
  } else {
    scheduler_.Enqueue(request);
  }
}

void Engine::RemoveWaiting(Request& request) {
  if (!request.waiting) return;
  if (static_batching()) {
    static_scheduler_->RemoveWaiting(request);
  } else {
    scheduler_.Remove(request);
  }
}

void Engine::Close(Request& request) {
  CheckOwnerThread();
  CheckNoStepInFlight("close a request");
  CloseRequest(request);
}

void Engine::CheckNoStepInFlight(const char* what) const {
  // An executor callback that calls back into the engine must not change what the live
  // transaction reserved.
  if (in_step_) throw ApiError(std::string("Cannot ") + what + " while a step is in flight.");
}

void Engine::CloseRequest(Request& request) noexcept {
  if (request.closed()) return;
  if (static_batching()) {
    // A resident static row stays in the batch (it shares the contiguous cache allocation) with its
    // frozen input until the batch is recycled; only the logical request goes away now.
    static_scheduler_->RemoveWaiting(request);
  } else {
    scheduler_.Remove(request);
    cache_.Release(request);
  }
  pending_.RemoveRequest(&request);
  EndTurnState(request);
  request.status = RequestStatus::Closed;
  request.Detach();
  std::vector<int32_t>().swap(request.tokens);
  // Drop the engine's strong reference last: the caller may hold the only other one.
  auto it = std::find_if(bound_.begin(), bound_.end(),
                         [&request](const std::shared_ptr<Request>& bound) { return bound.get() == &request; });
  if (it != bound_.end()) {
    std::shared_ptr<Request> keep = std::move(*it);
    bound_.erase(it);
  }
}

void Engine::ReclaimAbandoned() {
  if (in_step_ || !abandonment_pending_.load(std::memory_order_acquire)) return;  // after the step
  abandonment_pending_.store(false, std::memory_order_relaxed);
  for (size_t i = bound_.size(); i > 0; --i) {
    if (i - 1 >= bound_.size()) continue;
    Request& request = *bound_[i - 1];
    if (request.abandoned.load(std::memory_order_acquire)) CloseRequest(request);
  }
}

bool Engine::HasPendingRequests() {
  CheckOwnerThread();
  ReclaimAbandoned();
  const bool work = static_batching() ? static_scheduler_->HasExecutableWork() : scheduler_.HasExecutableWork();
  return !pending_.empty() || (!unhealthy_ && work);
}

void Engine::Run(OgaEngineEventBuffer& buffer) {
  if (unhealthy_ && pending_.empty()) ThrowIfUnhealthy();
  if (buffer.slots.empty()) return;  // capacity 0: validated no-op
  ++buffer.generation;
  buffer.count = 0;
  last_run_interrupted_ = false;
  ReclaimAbandoned();
  if (pending_.empty() && !unhealthy_) {
    interrupted_ = false;
    Step();
    if (interrupted_) {
      // The caller was interrupted (see OgaExtExecutionStatus_Interrupted): control goes back at
      // once; the step's Retryable event is delivered by the next Run.
      interrupted_ = false;
      last_run_interrupted_ = true;
      return;
    }
  }
  Deliver(buffer);
}

void Engine::Deliver(OgaEngineEventBuffer& buffer) {
  const size_t capacity = buffer.slots.size();
  while (buffer.count < capacity && !pending_.empty()) pending_.PopFrontInto(buffer.slots[buffer.count++]);
}

void Engine::Step() {
  struct InStep {
    bool& flag;
    explicit InStep(bool& f) : flag(f) { flag = true; }
    ~InStep() { flag = false; }
  } in_step(in_step_);
  if (static_batching()) {
    StepStatic();
    return;
  }
  try {
    const OgaExtExecutionStatus fault =
        faults() != nullptr ? faults()->Consult(OgaExtFaultPhase_Plan) : OgaExtExecutionStatus_Ok;
    if (fault == OgaExtExecutionStatus_Fatal) throw ContractError("injected planning consistency fault");
    if (fault != OgaExtExecutionStatus_Ok) throw std::bad_alloc();
    scheduler_.PlanStep(plan_);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& error) {
    Poison(OgaErrorCode_EngineContractFailure,
           std::string("Dynamic scheduler planning failed and the Engine is no longer healthy. Cause: ") + error.what());
    return;
  }
  if (limits_.preemption) PreemptForCapacity();
  switch (plan_.outcome) {
    case StepOutcome::NoWork:
      return;
    case StepOutcome::CapacityDeferred:
      PushEngineEvent(OgaEngineEventFlag_CapacityBlocked, OgaErrorCode_CapacityDeferred);
      return;
    case StepOutcome::UnserviceableRequest:
      // Publish the failures alone; the fitting work runs on the next call.
      for (Request* request : plan_.unserviceable) FailUnserviceable(*request);
      return;
    case StepOutcome::Executable:
      break;
  }
  const uint64_t start = NowNs();
  ExecuteTransaction();
  counters_.step_ns += NowNs() - start;
}

void Engine::ExecuteTransaction() {
  // Reserve the complete cache transaction.
  try {
    if (faults() != nullptr && faults()->Consult(OgaExtFaultPhase_Reserve) != OgaExtExecutionStatus_Ok) {
      throw ContractError("injected reservation fault");
    }
    cache_.Reserve(plan_);
    CheckFixedStateReservation();
  } catch (const InterruptedError&) {
    Rollback();
    RetryInterrupted();
    return;
  } catch (const std::exception& error) {
    cache_.Discard();
    Poison(OgaErrorCode_EngineContractFailure,
           std::string("Transaction preparation failed and the Engine is no longer healthy. Cause: ") + error.what());
    return;
  }
  // Checkpoint: requests are not mutated before publication (results are staged in staged_), so the
  // committed request state is itself the checkpoint and rollback only discards.
  const OgaExtStepInputs* inputs = nullptr;
  try {
    inputs = hybrid_io_ ? &hybrid_io_->Pack(plan_, cache_) : &io_.Pack(plan_, cache_);
  } catch (const std::exception& error) {
    Rollback();
    Poison(OgaErrorCode_EngineContractFailure,
           std::string("Transaction preparation failed and the Engine is no longer healthy. Cause: ") + error.what());
    return;
  }
  // Run the decoder once.
  OgaExtStepOutputs outputs{};
  const uint64_t execute_start = NowNs();
  ExecutionResult result = executor_.Execute(*inputs, outputs);
  counters_.executor_ns += NowNs() - execute_start;
  ++counters_.model_runs;
  switch (result.status) {
    case OgaExtExecutionStatus_Ok:
      break;
    case OgaExtExecutionStatus_Retryable:
      Rollback();
      PushEngineEvent(OgaEngineEventFlag_Retryable, OgaErrorCode_RetryableExecution);
      return;
    case OgaExtExecutionStatus_Interrupted:
      Rollback();
      RetryInterrupted();
      return;
    case OgaExtExecutionStatus_CapacityExceeded:
      Rollback();
      PushEngineEvent(OgaEngineEventFlag_CapacityBlocked, OgaErrorCode_ExecutionCapacityExceeded);
      return;
    default:
      Rollback();
      Poison(OgaErrorCode_EngineExecutionFailure,
             "Model execution failed and the Engine is no longer healthy. Cause: " + result.message);
      return;
  }
  const size_t expected_rows = executor_.per_token_logits() ? plan_.num_tokens : plan_.rows.size();
  if (const std::string failure = CheckLogitsOutputs(outputs, expected_rows); !failure.empty()) {
    Rollback();
    Poison(OgaErrorCode_EngineExecutionFailure,
           "Model execution failed and the Engine is no longer healthy. Cause: the executor returned " + failure);
    return;
  }
  // Select and stage next tokens.
  try {
    StageResults(outputs);
    // After the draws, so a rolled-back step proves that staged draws never reach the requests.
    if (faults() != nullptr && faults()->Consult(OgaExtFaultPhase_Sample) != OgaExtExecutionStatus_Ok) {
      throw RetryableStepError("injected post-processing fault");
    }
  } catch (const RetryableStepError&) {
    Rollback();
    PushEngineEvent(OgaEngineEventFlag_Retryable, OgaErrorCode_RetryableExecution);
    return;
  } catch (const InterruptedError&) {
    Rollback();
    RetryInterrupted();
    return;
  } catch (const std::bad_alloc&) {
    Rollback();
    PushEngineEvent(OgaEngineEventFlag_CapacityBlocked, OgaErrorCode_ExecutionCapacityExceeded);
    return;
  } catch (const std::exception& error) {
    // The device failed a read or a sampling launch (or returned nonsense): its state is unknown.
    Rollback();
    Poison(OgaErrorCode_EngineExecutionFailure,
           std::string("Token selection failed and the Engine is no longer healthy. Cause: ") + error.what());
    return;
  }
  // Prepare the commit: the last point where the transaction can still be undone.
  try {
    if (faults() != nullptr && faults()->Consult(OgaExtFaultPhase_CommitPrepare) != OgaExtExecutionStatus_Ok) {
      throw ContractError("injected commit-preparation fault");
    }
    cache_.ValidateCommit(plan_);
  } catch (const std::exception& error) {
    Rollback();
    Poison(OgaErrorCode_EngineContractFailure,
           std::string("Transaction preparation failed and the Engine is no longer healthy. Cause: ") + error.what());
    return;
  }
  // The fixed state's copies into inactive banks: the last fallible device work. Committed state is
  // intact after a failure, but a half-written inactive bank cannot be proven whole for a retry.
  try {
    cache_.PrepareCommit(plan_);
  } catch (const InterruptedError&) {
    // Only inactive banks and unpublished checkpoints were written: the retry writes them again.
    Rollback();
    RetryInterrupted();
    return;
  } catch (const std::exception& error) {
    Rollback();
    Poison(OgaErrorCode_EngineExecutionFailure,
           std::string("Transaction commit preparation failed and the Engine is no longer healthy. Cause: ") +
               error.what());
    return;
  }
  // Publication is fail-stop.
  try {
    if (faults() != nullptr && faults()->Consult(OgaExtFaultPhase_Commit) != OgaExtExecutionStatus_Ok) {
      throw std::runtime_error("injected commit fault");
    }
    PublishCommit();
  } catch (const std::exception& error) {
    cache_.Discard();
    Poison(OgaErrorCode_EngineExecutionFailure,
           std::string("Transaction commit failed and the Engine is no longer healthy. Cause: ") + error.what());
  }
}

std::string Engine::CheckLogitsOutputs(const OgaExtStepOutputs& outputs, size_t expected_rows) const {
  if (outputs.logits == nullptr || outputs.logits_rows != expected_rows || outputs.logits_row_stride < vocab_size_ ||
      outputs.logits_type > OgaExtLogitsType_Float16) {
    return std::to_string(outputs.logits_rows) + " logits rows of stride " + std::to_string(outputs.logits_row_stride) +
           "; expected " + std::to_string(expected_rows) + " rows of at least " + std::to_string(vocab_size_) +
           " logits";
  }
  if (outputs.logits_on_device != 0 && !device_logits_) {
    return "device logits, but its OgaExtDeviceOps has no read operation";
  }
  return std::string();
}

LogitsRow Engine::LogitsRowAt(const OgaExtStepOutputs& outputs, size_t row) const {
  if (outputs.logits_on_device != 0) return device_logits_->HostRow(row, outputs.logits_type);
  const size_t element_size = outputs.logits_type == OgaExtLogitsType_Float16 ? 2 : 4;
  LogitsRow logits;
  logits.data = static_cast<const char*>(outputs.logits) + row * outputs.logits_row_stride * element_size;
  logits.type = outputs.logits_type;
  return logits;
}

Engine::StagedResult Engine::SelectToken(Request& request, const LogitsRow& logits, size_t participant) {
  if (request.hold_logits || request.logits_held) {
    // A Generator asked for this row's logits: keep them for the caller instead of selecting. Logits
    // still held from before a preemption (set_logits may have changed them) are kept as they are.
    StagedResult staged;
    staged.hold = true;
    if (!request.logits_held) CopyLogitsRow(logits, vocab_size_, request.held_logits.data());
    return staged;
  }
  return SelectFromLogits(request, logits, participant);
}

Engine::StagedResult Engine::SelectFromLogits(Request& request, const LogitsRow& logits, size_t participant) {
  SamplingScratch& scratch = scratches_[participant];
  StagedResult staged;
  const TurnPolicy& policy = request.policy;
  const bool mask_eos = request.turn_generated_tokens < policy.min_generated_tokens;
  // Guidance masks the row first (before the EOS floor and the other processors, as in 0.18).
  const uint32_t* allowed = nullptr;
  if (request.guidance) {
    allowed = request.guidance->Mask();
    if (allowed == nullptr) {
      staged.finish_reason = OgaFinishReason_Failed;  // the grammar cursor is poisoned for good
      return staged;
    }
  }
  int32_t token;
  if (policy.greedy && !policy.processes_logits() && allowed == nullptr) {
    token = SelectGreedy(logits, vocab_size_, eos_ids_, mask_eos);  // no copy of the row needed
  } else {
    LoadLogits(logits, vocab_size_, scratch);
    if (allowed != nullptr) ApplyAllowedMask(allowed, scratch);
    ProcessLogits(request.tokens, eos_ids_, mask_eos, policy.repetition_penalty, policy.no_repeat_ngram_size,
                  scratch);
    if (policy.greedy) {
      token = ArgMaxProcessed(scratch);  // a greedy step draws nothing
    } else {
      // Draw from a copy: the request's stream (or the turn's reseed) advances only at commit.
      staged.stream = policy.seed ? RandomStream(*policy.seed) : request.stream;
      staged.drew = true;
      token = SampleProcessed(policy.temperature, policy.top_k, policy.top_p, staged.stream, scratch);
    }
  }
  if (token < 0) {
    // The processors masked every token (e.g. a no-repeat n-gram of size 1 over a sequence that used
    // the whole vocabulary, or an EOS floor where the grammar allows only EOS). Retrying would stall
    // the batch forever, so the row falls back to the top raw logit the grammar allows, still
    // honouring the EOS floor when anything else is left.
    if (allowed != nullptr) {
      LoadLogits(logits, vocab_size_, scratch);
      ApplyAllowedMask(allowed, scratch);
      token = ArgMaxProcessed(scratch);
      if (token < 0) {
        staged.finish_reason = OgaFinishReason_Failed;  // the grammar allows no token at all
        return staged;
      }
    } else {
      token = SelectGreedy(logits, vocab_size_, eos_ids_, mask_eos);
      if (token < 0) token = SelectGreedy(logits, vocab_size_, eos_ids_, false);
      if (token < 0) throw RetryableStepError("every logit of a row is NaN");
    }
  }
  StageSelectedToken(request, token, staged, participant);
  return staged;
}

void Engine::StageSelectedToken(Request& request, int32_t token, StagedResult& staged, size_t participant) {
  if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) {
    staged.finish_reason = OgaFinishReason_Eos;  // EOS is neither appended nor emitted
    staged.eos_token = token;
    return;
  }
  staged.tokens[staged.count++] = token;
  StageTurnEnd(request, staged, participant);
}

bool Engine::StageTurnEnd(Request& request, StagedResult& staged, size_t participant) {
  if (request.tokens.size() + staged.count > request.tokens.capacity()) {
    // Grow geometrically (before publication, where allocation may still fail safely) so a
    // request reallocates O(log length) times over its life.
    request.tokens.reserve(std::min<size_t>(std::max<size_t>(request.tokens.size() * 2, 64),
                                            static_cast<size_t>(request.max_session_tokens)));
  }
  const uint64_t generated = request.turn_generated_tokens + staged.count;
  const uint64_t length = request.tokens.size() + staged.count;
  // Precedence for one token: StopString > MaxGeneratedTokens > MaxSessionTokens.
  if (request.stop.enabled()) {
    staged.matched_stop_string = request.stop.Peek(staged.tokens.data(), staged.count, stop_scratches_[participant]);
  }
  if (staged.matched_stop_string >= 0) {
    staged.finish_reason = OgaFinishReason_StopString;
  } else if (request.policy.max_generated_tokens != 0 && generated >= request.policy.max_generated_tokens) {
    staged.finish_reason = OgaFinishReason_MaxGeneratedTokens;
  } else if (length >= request.max_session_tokens) {
    staged.finish_reason = OgaFinishReason_MaxSessionTokens;
  }
  return staged.finish_reason != OgaFinishReason_None;
}

void Engine::PublishToken(Request& request, const StagedResult& staged) {
  if (staged.hold) {
    request.hold_logits = false;
    request.logits_held = true;
    request.status = RequestStatus::Active;
    return;
  }
  if (request.paced && request.allowance > 0) --request.allowance;
  request.eos_token = staged.eos_token;
  if (staged.drew) {
    request.stream = staged.stream;
    request.policy.seed.reset();  // the turn's reseed is durable now
  }
  if (staged.finish_reason == OgaFinishReason_Failed) {
    PublishTerminal(request, OgaFinishReason_Failed, OgaErrorCode_RequestUnserviceable);
    return;
  }
  const bool finished = staged.finish_reason != OgaFinishReason_None;
  for (size_t i = 0; i < staged.count; ++i) {
    const int32_t token = staged.tokens[i];
    request.tokens.push_back(token);  // capacity ensured by StageTurnEnd
    ++request.turn_generated_tokens;
    if (request.stop.enabled()) request.stop.Advance(token);
    if (request.guidance) request.guidance->Consume(token);
  }
  if (finished) EndTurnState(request);
  request.status = finished ? RequestStatus::TurnComplete : RequestStatus::Active;
  request.finish_reason = staged.finish_reason;
  // One event per token; the last one carries the turn's end. EOS alone ends it in its own event.
  const size_t events = std::max<size_t>(staged.count, finished ? 1 : 0);
  for (size_t i = 0; i < events; ++i) {
    const bool last = i + 1 == events;
    const bool token = i < staged.count;
    EngineEvent event;
    event.request = request.shared_from_this();
    event.flags = (token ? OgaEngineEventFlag_Token : 0u) | (last && finished ? OgaEngineEventFlag_TurnFinished : 0u);
    event.turn_id = request.turn_id;
    event.token = token ? staged.tokens[i] : 0;
    if (last && finished) {
      event.finish_reason = staged.finish_reason;
      event.matched_stop_string_index = staged.matched_stop_string;
      event.usage = UsageOf(request);
    }
    pending_.Push(std::move(event));
  }
}

void Engine::EndTurnState(Request& request) noexcept {
  request.hold_logits = false;
  request.logits_held = false;
  request.stop.Clear();
  request.guidance.reset();
  request.draft_tokens.clear();  // any terminal boundary discards a pending proposal
  request.recomputing = false;
}

void Engine::StageResults(const OgaExtStepOutputs& outputs) {
  const bool per_token = executor_.per_token_logits();
  size_t count = 0;
  for (size_t r = 0; r < plan_.rows.size(); ++r) {
    const RequestStepPlan& row = plan_.rows[r];
    staged_[r] = StagedResult{};
    if (!row.samples) continue;  // partial prefill: progress without a token
    select_requests_[count] = row.request;
    select_logits_rows_[count] = per_token ? row.logits_index : r;
    select_staged_[count] = &staged_[r];
    select_rows_[count] = &row;
    ++count;
  }
  SelectTokens(count, outputs);
}

void Engine::SelectTokens(size_t count, const OgaExtStepOutputs& outputs) {
  if (outputs.logits_on_device != 0) count = SelectOnDevice(count, outputs);
  select_outputs_ = &outputs;
  workers_.Run(
      count,
      [](void* context, size_t i, size_t participant) {
        Engine& engine = *static_cast<Engine*>(context);
        const RequestStepPlan* row = engine.select_rows_[i];
        if (row != nullptr && row->draft_count > 0) {
          *engine.select_staged_[i] =
              engine.VerifyDrafts(*engine.select_requests_[i], *row, *engine.select_outputs_, participant);
          return;
        }
        const LogitsRow logits = engine.LogitsRowAt(*engine.select_outputs_, engine.select_logits_rows_[i]);
        *engine.select_staged_[i] = engine.SelectToken(*engine.select_requests_[i], logits, participant);
      },
      this);
}

size_t Engine::SelectOnDevice(size_t count, const OgaExtStepOutputs& outputs) {
  DeviceLogits& device = *device_logits_;
  device.ClearSamples();
  device.ClearReads();
  device_select_.clear();
  host_select_.clear();
  for (size_t i = 0; i < count; ++i) {
    const Request& request = *select_requests_[i];
    const TurnPolicy& policy = request.policy;
    const bool drafts = select_rows_[i] != nullptr && select_rows_[i]->draft_count > 0;
    // What the device sampler does not do (see OgaExtDeviceSampling) stays on the host.
    if (!device.can_sample() || drafts || request.guidance || policy.no_repeat_ngram_size > 0 ||
        request.hold_logits || request.logits_held) {
      host_select_.push_back(i);
      continue;
    }
    const RandomStream stream = policy.seed ? RandomStream(*policy.seed) : request.stream;
    device.AddSample(static_cast<int32_t>(select_logits_rows_[i]), policy.greedy ? 0.0f : policy.temperature,
                     policy.top_k, policy.top_p, stream.key(), stream.counter(),
                     request.turn_generated_tokens < policy.min_generated_tokens, policy.repetition_penalty,
                     request.tokens);
    device_select_.push_back(i);
  }
  const int32_t* tokens = device.Sample(outputs, eos_ids_);
  bool reordered = false;
  for (size_t j = 0; j < device_select_.size(); ++j) {
    const size_t i = device_select_[j];
    if (tokens[j] < 0) {
      // Nothing was left after masking: the host's fallbacks need the raw row.
      host_select_.push_back(i);
      reordered = true;
      continue;
    }
    Request& request = *select_requests_[i];
    StagedResult& staged = *select_staged_[i];
    staged = StagedResult{};
    if (!request.policy.greedy) {
      staged.stream = device.StreamAfterDraw(j);
      staged.drew = true;
    }
    StageSelectedToken(request, tokens[j], staged, 0);
    ++counters_.device_sampled_rows;
  }
  if (reordered) std::sort(host_select_.begin(), host_select_.end());
  // Read back what the host rows need, in one call.
  for (const size_t i : host_select_) {
    const RequestStepPlan* row = select_rows_[i];
    const size_t rows = row != nullptr && row->draft_count > 0 ? row->draft_count + 1 : 1;
    for (size_t k = 0; k < rows; ++k) device.MarkRead(select_logits_rows_[i] + k, outputs.logits_rows);
  }
  device.Read(outputs);
  counters_.host_read_logits_rows += device.read_count();
  // Host rows to the front, in order (host_select_[k] >= k, so nothing is overwritten unread).
  for (size_t k = 0; k < host_select_.size(); ++k) {
    const size_t i = host_select_[k];
    select_requests_[k] = select_requests_[i];
    select_logits_rows_[k] = select_logits_rows_[i];
    select_staged_[k] = select_staged_[i];
    select_rows_[k] = select_rows_[i];
  }
  return host_select_.size();
}

void Engine::CheckFixedStateReservation() const {
  const FixedStatePool* pool = cache_.fixed_state();
  const FixedStatePlan& planned = plan_.fixed_state;
  if (planned.required != (pool != nullptr)) {
    throw ContractError("the step plan's fixed-state requirement does not match the model");
  }
  if (pool == nullptr) return;
  if (!pool->reservation_live() || pool->reserved_rows() != planned.rows || planned.rows != plan_.rows.size() ||
      pool->reserved_new_slots() != planned.new_slots || pool->reserved_binding_bytes() != planned.binding_bytes) {
    throw ContractError("the fixed-state reservation does not match the planned fixed-state resources");
  }
  for (size_t r = 0; r < plan_.rows.size(); ++r) {
    if (pool->reserved_owner(r) != plan_.rows[r].request) {
      throw ContractError("a fixed-state reservation row names another request than the plan");
    }
  }
}

void Engine::SetFixedStateFallbackOnly(bool fallback_only) {
  FixedStatePool* pool = cache_.fixed_state();
  if (pool == nullptr) throw ApiError("This engine's model has no fixed decoder state.");
  pool->set_fallback_only(fallback_only);
}

void Engine::PublishCommit() {
  const FixedStatePool* fixed = cache_.fixed_state();
  const bool fixed_direct = fixed != nullptr && fixed->direct();
  cache_.Commit(plan_);
  scheduler_.CommitAdmissions(plan_);
  // Scheduler order, whatever order the rows executed in: events follow it.
  for (const size_t r : plan_.publish_order) {
    const RequestStepPlan& row = plan_.rows[r];
    row.request->processed = row.processed_before + row.committed_tokens();
    // Tokens a preempted cache had held are redone work (adopted prefix-cache blocks are not).
    size_t& until = row.request->recompute_until;
    if (row.processed_before < until) counters_.recomputed_tokens += std::min(until, row.request->processed) - row.processed_before;
    if (row.request->processed >= until) until = 0;
    if (row.request->recomputing) {
      if (row.samples) {
        row.request->recomputing = false;
        row.request->draft_tokens.clear();  // proposed for the token this step sampled
      }
    } else if (row.newly_admitted) {
      // Only adopted tokens of this turn's own input count (a rewound request re-adopts its history).
      const size_t adopted = row.cached_blocks * cache_.block_size();
      const size_t history = row.request->turn_starts.empty() ? 0 : row.request->turn_starts.back().second;
      row.request->turn_cached_tokens = adopted > history ? adopted - history : 0;
    }
    if (row.samples && !row.prefill) row.request->draft_tokens.clear();  // a committed decode consumes its proposal
    if (row.draft_count > 0) CountVerification(row, staged_[r]);
    if (row.samples) PublishToken(*row.request, staged_[r]);
    if (row.samples && staged_[r].finish_reason == OgaFinishReason_Failed) failed_rows_.push_back(row.request);
  }
  cache_.IndexCommitted(plan_);
  for (const RequestStepPlan& row : plan_.rows) {
    if (row.draft_count > 0) {
      ++speculative_.target_forward_passes;
      break;
    }
  }
  // A turn that failed in this step cannot continue: its cache goes back to the pool now.
  for (Request* request : failed_rows_) {
    scheduler_.Remove(*request);
    cache_.Release(*request);
  }
  failed_rows_.clear();
  ++counters_.committed_steps;
  if (fixed != nullptr) ++(fixed_direct ? counters_.fixed_state_direct_steps : counters_.fixed_state_fallback_steps);
}

void Engine::Rollback() {
  cache_.Discard();
  ++counters_.rolled_back_steps;
}

void Engine::PreemptForCapacity() {
  // Preemption is a committed operation of its own, before the step's transaction: it changes no
  // request's tokens, turn, search or sampler state, only where (whether) its KV cache lives, which
  // is derived state a prefill recomputes. A step that then rolls back leaves the victims queued.
  bool preempted_running = false;
  while (plan_.outcome == StepOutcome::CapacityDeferred ||
         (plan_.outcome == StepOutcome::Executable && plan_.deferred_residents > 0)) {
    Request* victim = scheduler_.PreemptionVictim();
    if (victim == nullptr) return;
    scheduler_.ReserveWaitingSlot();  // may throw bad_alloc before anything changed
    preempted_running = preempted_running || victim->executable();
    Preempt(*victim);
    // Admitting into the room a running victim just made would only preempt again.
    scheduler_.PlanStep(plan_, !preempted_running);
  }
}

void Engine::Preempt(Request& request) {
  const bool running = request.executable();
  const size_t cached = request.processed;
  scheduler_.Remove(request);
  cache_.Release(request);
  request.processed = 0;
  request.recompute_until = std::max(request.recompute_until, cached);
  ++counters_.preemptions;
  if (!running) return;  // turn-complete: its next BeginTurn queues it like a rewound request
  // The caller's proposal was for the token after the pending one; the recompute samples that token.
  request.draft_tokens.clear();
  // Queued to prefill again: Assigned, like any turn waiting for admission.
  request.status = RequestStatus::Assigned;
  request.recomputing = true;
  scheduler_.EnqueueFront(request);
}

void Engine::FailUnserviceable(Request& request) {
  scheduler_.Remove(request);
  cache_.Release(request);
  PublishTerminal(request, OgaFinishReason_Failed, OgaErrorCode_RequestUnserviceable);
}

void Engine::RetryInterrupted() {
  PushEngineEvent(OgaEngineEventFlag_Retryable, OgaErrorCode_RetryableExecution);
  interrupted_ = true;
}

void Engine::PushEngineEvent(OgaEngineEventFlags flags, OgaErrorCode code) {
  EngineEvent event;
  event.flags = flags;
  event.error_code = code;
  pending_.Push(std::move(event));
}

void Engine::PublishTerminal(Request& request, OgaFinishReason reason, OgaErrorCode code) {
  request.status = RequestStatus::TurnComplete;
  request.finish_reason = reason;
  EndTurnState(request);
  const OgaEngineEventFlags terminal =
      OgaEngineEventFlag_TurnFinished | (reason == OgaFinishReason_Failed ? OgaEngineEventFlag_Failed : 0u);
  for (size_t i = pending_.size(); i > 0; --i) {
    EngineEvent& retained = pending_.At(i - 1);
    if (retained.request.get() != &request) continue;
    if (retained.turn_id == request.turn_id && (retained.flags & OgaEngineEventFlag_TurnFinished) == 0) {
      retained.flags |= terminal;
      retained.finish_reason = reason;
      retained.error_code = code;
      retained.usage = UsageOf(request);
      return;
    }
    break;
  }
  EngineEvent event;
  event.flags = terminal;
  event.turn_id = request.turn_id;
  event.finish_reason = reason;
  event.error_code = code;
  event.usage = UsageOf(request);
  event.request = request.shared_from_this();
  pending_.Push(std::move(event));
}

void Engine::Poison(OgaErrorCode code, const std::string& message) noexcept {
  try {
    unhealthy_ = true;
    fatal_message_ = message;
  } catch (...) {
    fatal_message_.clear();
  }
  if (fatal_message_.empty()) {
    fatal_message_ = "The Engine encountered a fatal failure, and the underlying exception could not be recorded.";
  }
  bool affected = false;
  try {
    std::vector<Request*> executable;
    CollectExecutable(executable);
    for (Request* request : executable) {
      RemoveWaiting(*request);
      PublishTerminal(*request, OgaFinishReason_Failed, code);
      affected = true;
    }
    if (!affected) PushEngineEvent(OgaEngineEventFlag_Failed, code);
  } catch (...) {
    // Out of memory while publishing failures: the stored error still makes every later call fail.
  }
}

void Engine::CollectExecutable(std::vector<Request*>& out) const {
  if (static_batching()) {
    for (const StaticRow& row : static_scheduler_->rows()) {
      if (row.request->executable()) out.push_back(row.request.get());
    }
    for (Request* request : static_scheduler_->waiting()) out.push_back(request);
    return;
  }
  for (Request* request : scheduler_.residents()) {
    if (request->executable()) out.push_back(request);
  }
  for (Request* request : scheduler_.waiting()) out.push_back(request);
}

void Engine::StepStatic() {
  StaticStepKind kind = StaticStepKind::None;
  const OgaExtStaticStepInputs* inputs = nullptr;
  std::vector<StaticRow>& rows = static_scheduler_->rows();
  try {
    kind = static_scheduler_->PlanStep();
    if (kind == StaticStepKind::None) return;
    inputs = &static_io_->Pack(kind, rows);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& error) {
    Poison(OgaErrorCode_EngineContractFailure,
           std::string("Static scheduler failed and the Engine is no longer healthy. Cause: ") + error.what());
    return;
  }
  const uint64_t start = NowNs();
  OgaExtStepOutputs outputs{};
  ExecutionResult result = executor_.ExecuteStatic(*inputs, outputs);
  counters_.executor_ns += NowNs() - start;
  ++counters_.model_runs;
  if (result.status == OgaExtExecutionStatus_Ok) {
    if (const std::string failure = CheckLogitsOutputs(outputs, rows.size()); !failure.empty()) {
      result.status = OgaExtExecutionStatus_Fatal;
      result.message = "the executor returned " + failure;
    }
  }
  // A failed static step has mutated no request: the rows simply run the same step again.
  switch (result.status) {
    case OgaExtExecutionStatus_Ok:
      break;
    case OgaExtExecutionStatus_Retryable:
      PushEngineEvent(OgaEngineEventFlag_Retryable, OgaErrorCode_RetryableExecution);
      return;
    case OgaExtExecutionStatus_Interrupted:
      RetryInterrupted();
      return;
    case OgaExtExecutionStatus_CapacityExceeded:
      PushEngineEvent(OgaEngineEventFlag_CapacityBlocked, OgaErrorCode_ExecutionCapacityExceeded);
      return;
    default:
      Poison(OgaErrorCode_EngineExecutionFailure,
             "Static-batch execution failed and the Engine is no longer healthy. Cause: " + result.message);
      return;
  }
  try {
    size_t count = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      Request& request = *rows[r].request;
      static_staged_[r] = StagedResult{};
      if (!request.schedulable()) continue;
      select_requests_[count] = &request;
      select_logits_rows_[count] = r;
      select_staged_[count] = &static_staged_[r];
      select_rows_[count] = nullptr;
      ++count;
    }
    SelectTokens(count, outputs);
  } catch (const RetryableStepError&) {
    PushEngineEvent(OgaEngineEventFlag_Retryable, OgaErrorCode_RetryableExecution);
    return;
  } catch (const InterruptedError&) {
    RetryInterrupted();
    return;
  } catch (const std::bad_alloc&) {
    PushEngineEvent(OgaEngineEventFlag_CapacityBlocked, OgaErrorCode_ExecutionCapacityExceeded);
    return;
  } catch (const std::exception& error) {
    Poison(OgaErrorCode_EngineExecutionFailure,
           std::string("Token selection failed and the Engine is no longer healthy. Cause: ") + error.what());
    return;
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    StaticRow& row = rows[r];
    Request& request = *row.request;
    if (!request.schedulable()) continue;  // frozen row
    request.processed = kind == StaticStepKind::Decode ? request.processed + 1 : request.tokens.size();
    row.processed = request.processed;
    PublishToken(request, static_staged_[r]);
    // What the row is fed once its turn has ended: its own next token, or padding after EOS.
    row.frozen_token = request.processed < request.tokens.size() ? request.tokens[request.processed]
                                                                 : model_->config().pad_token_id;
  }
  ++counters_.committed_steps;
  counters_.step_ns += NowNs() - start;
}

void Engine::SetLastTurnIdForTesting(Request& request, uint64_t turn_id) {
  CheckOwnerThread();
  if (request.executable() || request.closed() || request.retained_events > 0) {
    throw ApiError("The last turn id can only be set on an idle request without pending events.");
  }
  request.turn_id = turn_id;
}

}  // namespace oga
