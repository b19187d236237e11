// A static-batching decoder's engine (OGA's CPU builds: GroupQueryAttention over contiguous
// caches), what oga/executor/static.py StaticOnnxEngineExecutor does without Python: per-layer caches
// [max_batch_size, kv_heads, max_length, head_size] allocated once and zeroed, bound as both past
// and present over the leading batch_size rows (contiguous), so the graph updates them in place;
// the logits of every query position land in a buffer that only grows, and the one row per
// request the engine reads is gathered from it. Fixed decoder state (LFM2's conv layers): two banks
// per tensor, read one and write the other, swapped when a step succeeds, zeroed for a new batch's
// prefill. With fixed state or sliding-window layers, a prefill whose rows differ in length runs
// each row alone over its own tokens, so no padding reaches them (static.py says why).
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine.h"

namespace native {

namespace {

struct StaticEngine : Engine {
  struct Cache {
    const std::string* past;
    const std::string* present;
    void* data;
  };
  std::vector<Cache> caches;
  struct FixedBanks {
    void* bank[2];  // [rows, row_bytes] each
  };
  std::vector<FixedBanks> fixed;  // one per model.fixed_states entry
  int committed = 0;              // the bank of every fixed tensor that holds the committed state
  size_t rows = 0, length = 0;
  size_t bound_first = 0, bound_rows = 0;  // the rows the caches are bound for (0 rows: none yet)
  void* step_logits = nullptr;
  size_t step_logits_bytes = 0;
  void* logits = nullptr;  // [rows, vocab]: one row per request
  BoundSlot input_ids_slot, mask_slot, positions_slot, logits_slot;

  explicit StaticEngine(Model* m) : Engine(m, true) {}
  ~StaticEngine() override {
    for (const Cache& cache : caches) std::free(cache.data);
    for (const FixedBanks& banks : fixed) {
      std::free(banks.bank[0]);
      std::free(banks.bank[1]);
    }
    std::free(step_logits);
    std::free(logits);
  }
};

// The graph's batch and sequence dimensions of every cache against what the engine binds.
std::string CheckGeometry(const Model& model, size_t rows, size_t length) {
  for (const CacheTensor& tensor : model.cache_tensors) {
    int64_t batch = tensor.dims[0];
    if (batch >= 0 && !(batch == 1 && rows == 1)) {
      std::string binds =
          rows == 1 ? "1 row (engine.static_batching.max_batch_size is 1)"
                    : "one row per request of a batch, 1 to " + std::to_string(rows) +
                          " rows (engine.static_batching.max_batch_size is " + std::to_string(rows) +
                          "); the graph's batch dimension must be symbolic";
      return model.path + ": " + tensor.name + " dimension 0 is " + std::to_string(batch) +
             " in the graph, but the engine binds " + binds + ".";
    }
    if (tensor.dims[2] >= 0 && static_cast<size_t>(tensor.dims[2]) != length)
      return DimensionMismatch(model, tensor.name, 2, tensor.dims[2],
                               "the engine allocates " + std::to_string(length) +
                                   " positions per request (search.max_length, else model.context_length)");
  }
  return "";
}

}  // namespace

Engine* OpenStaticEngine(Model* model, const OgaExtEngineGeometry& geometry, OgaExtExecutionStatus* status,
                         std::string* message) {
  *status = OgaExtExecutionStatus_Fatal;
  *message = CheckGeometry(*model, geometry.max_batch_size, geometry.max_sequence_length);
  if (!message->empty()) return nullptr;
  StaticEngine* engine = new StaticEngine(model);
  engine->rows = geometry.max_batch_size;
  engine->length = geometry.max_sequence_length;
  const size_t bytes =
      engine->rows * model->kv_heads * engine->length * model->head_size * ElementSize(model->cache_type);
  for (const Layer& layer : model->layers) {
    const std::string* pairs[2][2] = {{&layer.past_key, &layer.present_key}, {&layer.past_value, &layer.present_value}};
    for (const auto& pair : pairs) {
      void* data = AllocateZeroed(bytes);
      if (data == nullptr) {
        delete engine;
        *status = OgaExtExecutionStatus_CapacityExceeded;
        *message = "cannot allocate the KV cache: " + std::to_string(bytes) + " bytes for " + *pair[0];
        return nullptr;
      }
      engine->caches.push_back({pair[0], pair[1], data});
    }
  }
  for (const FixedState& state : model->fixed_states) {
    StaticEngine::FixedBanks banks{{AllocateZeroed(engine->rows * state.row_bytes),
                                    AllocateZeroed(engine->rows * state.row_bytes)}};
    engine->fixed.push_back(banks);
    if (banks.bank[0] == nullptr || banks.bank[1] == nullptr) {
      delete engine;
      *status = OgaExtExecutionStatus_CapacityExceeded;
      *message = "cannot allocate the fixed state of " + state.input;
      return nullptr;
    }
  }
  engine->logits = AllocateZeroed(engine->rows * model->vocab * ElementSize(model->logits_type));
  if (engine->logits == nullptr) {
    delete engine;
    *status = OgaExtExecutionStatus_CapacityExceeded;
    *message = "cannot allocate the logits buffer";
    return nullptr;
  }
  *status = OgaExtExecutionStatus_Ok;
  return engine;
}

namespace {

// Binds rows [first, first + count) of the caches (past and present: one buffer) and of the fixed
// state banks (past: the committed bank, present: the other).
void BindRows(StaticEngine& engine, size_t first, size_t count) {
  const Model& model = *engine.model;
  HostBinding& binding = engine.binding;
  if (engine.bound_first != first || engine.bound_rows != count) {
    const int64_t shape[4] = {static_cast<int64_t>(count), static_cast<int64_t>(model.kv_heads),
                              static_cast<int64_t>(engine.length), static_cast<int64_t>(model.head_size)};
    const size_t row_bytes = model.kv_heads * engine.length * model.head_size * ElementSize(model.cache_type);
    for (const StaticEngine::Cache& cache : engine.caches) {
      void* rows = static_cast<char*>(cache.data) + first * row_bytes;
      binding.Bind(nullptr, *cache.past, model.cache_type, rows, shape, 4, false);
      binding.Bind(nullptr, *cache.present, model.cache_type, rows, shape, 4, true);
    }
    engine.bound_first = first;
    engine.bound_rows = count;
  }
  for (size_t t = 0; t < engine.fixed.size(); ++t) {
    const FixedState& state = model.fixed_states[t];
    int64_t shape[BoundSlot::kMaxRank] = {static_cast<int64_t>(count)};
    for (size_t d = 0; d < state.row_dims.size(); ++d) shape[d + 1] = state.row_dims[d];
    const size_t rank = state.row_dims.size() + 1;
    char* past = static_cast<char*>(engine.fixed[t].bank[engine.committed]) + first * state.row_bytes;
    char* present = static_cast<char*>(engine.fixed[t].bank[1 - engine.committed]) + first * state.row_bytes;
    binding.Bind(nullptr, state.input, state.type, past, shape, rank, false);
    binding.Bind(nullptr, state.output, state.type, present, shape, rank, true);
  }
}

// One run over rows [first, first + count): `query` tokens of input_ids / position_ids and `total`
// columns of attention_mask per row, each at `stride` / `mask_stride` elements from the previous
// row. The logits of every query position land in engine.step_logits.
OgaExtExecutionStatus Run(StaticEngine& engine, size_t first, size_t count, size_t query, size_t total,
                          const int64_t* input_ids, const int64_t* attention_mask, const int64_t* position_ids,
                          std::string* message) {
  const Model& model = *engine.model;
  HostBinding& binding = engine.binding;
  BindRows(engine, first, count);
  int64_t shape[3] = {static_cast<int64_t>(count), static_cast<int64_t>(query), 0};
  binding.Bind(&engine.input_ids_slot, model.input_ids, ortapi::kInt64, input_ids, shape, 2, false);
  if (!model.position_ids.empty())
    binding.Bind(&engine.positions_slot, model.position_ids, ortapi::kInt64, position_ids, shape, 2, false);
  shape[1] = static_cast<int64_t>(total);
  binding.Bind(&engine.mask_slot, model.attention_mask, ortapi::kInt64, attention_mask, shape, 2, false);
  const size_t row_bytes = model.vocab * ElementSize(model.logits_type);
  const size_t needed = count * query * row_bytes;
  if (needed > engine.step_logits_bytes) {
    // Grows only (a longer prefill than any before), so a decode step never allocates.
    std::free(engine.step_logits);
    engine.step_logits = std::malloc(needed);
    engine.step_logits_bytes = engine.step_logits ? needed : 0;
    if (engine.step_logits == nullptr) {
      *message = "cannot allocate " + std::to_string(needed) + " bytes of logits for the static step";
      return OgaExtExecutionStatus_CapacityExceeded;
    }
  }
  shape[1] = static_cast<int64_t>(query);
  shape[2] = static_cast<int64_t>(model.vocab);
  binding.Bind(&engine.logits_slot, model.logits, model.logits_type, engine.step_logits, shape, 3, true);
  if (OrtStatus* status = binding.Run()) return RunFailure(model.api, status, message);
  return OgaExtExecutionStatus_Ok;
}

}  // namespace

OgaExtExecutionStatus ExecuteStatic(Engine* base, const OgaExtStaticStepInputs* in, OgaExtStepOutputs* out,
                                    std::string* message) {
  StaticEngine* engine = static_cast<StaticEngine*>(base);
  const Model& model = *engine->model;
  const size_t batch = in->batch_size, query = in->sequence_length, total = in->total_sequence_length;
  if (batch == 0 || batch > engine->rows) {
    *message = "the static step has " + std::to_string(batch) + " rows; the engine's caches hold 1 to " +
               std::to_string(engine->rows);
    return OgaExtExecutionStatus_Fatal;
  }
  bool unequal = false;
  for (size_t r = 0; r < batch; ++r) {
    const int32_t position = in->logits_positions[r];
    if (position < 0 || static_cast<size_t>(position) >= query) {
      *message = "row " + std::to_string(r) + " asks for the logits of query position " + std::to_string(position) +
                 " of " + std::to_string(query);
      return OgaExtExecutionStatus_Fatal;
    }
    unequal = unequal || static_cast<size_t>(position) + 1 != query;
  }
  if (in->new_batch) {
    for (size_t t = 0; t < engine->fixed.size(); ++t)
      std::memset(engine->fixed[t].bank[engine->committed], 0, batch * model.fixed_states[t].row_bytes);
  }
  const size_t row_bytes = model.vocab * ElementSize(model.logits_type);
  char* rows = static_cast<char*>(engine->logits);
  if (model.static_rows_alone && in->new_batch && unequal) {
    // Each row over its own tokens: the first `fed` of its query, and of its mask (a new batch's
    // mask is ones up to the row's length).
    for (size_t r = 0; r < batch; ++r) {
      const size_t fed = static_cast<size_t>(in->logits_positions[r]) + 1;
      const OgaExtExecutionStatus status =
          Run(*engine, r, 1, fed, fed, in->input_ids + r * query, in->attention_mask + r * total,
              in->position_ids + r * query, message);
      if (status != OgaExtExecutionStatus_Ok) return status;
      std::memcpy(rows + r * row_bytes, static_cast<const char*>(engine->step_logits) + (fed - 1) * row_bytes,
                  row_bytes);
    }
  } else {
    const OgaExtExecutionStatus status =
        Run(*engine, 0, batch, query, total, in->input_ids, in->attention_mask, in->position_ids, message);
    if (status != OgaExtExecutionStatus_Ok) return status;
    const char* step = static_cast<const char*>(engine->step_logits);
    for (size_t r = 0; r < batch; ++r) {
      const size_t position = static_cast<size_t>(in->logits_positions[r]);
      std::memcpy(rows + r * row_bytes, step + (r * query + position) * row_bytes, row_bytes);
    }
  }
  engine->committed = 1 - engine->committed;  // the state just written is now the committed one
  out->logits = engine->logits;
  out->logits_type = model.logits_type == ortapi::kFloat16 ? OgaExtLogitsType_Float16 : OgaExtLogitsType_Float32;
  out->logits_rows = batch;
  out->logits_row_stride = model.vocab;
  out->logits_on_device = 0;
  return OgaExtExecutionStatus_Ok;
}

}  // namespace native
