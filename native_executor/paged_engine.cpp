// A paged decoder's engine: what the Python host path (oga/executor/host.py OnnxEngineExecutor)
// does per step, without Python. The engine's packed buffers are bound where they are; each cache
// is allocated once, zeroed, and bound as both its past input and its present output (the graph
// updates it in place); a sliding-window ring layer's caches hold the window blocks; fixed decoder
// state stays in the engine's memory and is bound by address every step; the logits land in a
// buffer allocated once at the row limit.
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <vector>

#include "engine.h"

namespace native {

namespace {

// The step inputs and the logits output, each bound where the engine (or the executor) keeps it.
enum Slot { kInputIds, kPositionIds, kCumulative, kPast, kBlockTable, kBlockTableWindowed, kMetadata, kLogitsIndices,
            kLogits, kBlockMaxima, kSlots };

// OgaExtStepOutputs.logits_block_maxima's block (OGA_EXT_LOGITS_BLOCK).
constexpr size_t kLogitsBlock = OGA_EXT_LOGITS_BLOCK;

struct PagedEngine : Engine {
  std::vector<void*> caches;
  void* logits = nullptr;
  size_t logits_rows = 0;
  float* block_maxima = nullptr;  // [logits_rows, maxima_stride] when the graph has the output
  size_t maxima_stride = 0;
  BoundSlot slots[kSlots];
  std::vector<BoundSlot> fixed_slots;  // (input, output, capture) per fixed tensor

  explicit PagedEngine(Model* m) : Engine(m, false), fixed_slots(3 * m->fixed_states.size()) {}
  ~PagedEngine() override {
    for (void* cache : caches) std::free(cache);
    std::free(logits);
    std::free(block_maxima);
  }
};

std::string LayerList(const Model& model) {
  std::string text = "[";
  for (const Layer& layer : model.layers) {
    if (!layer.ring) continue;
    if (text.size() > 1) text += ", ";
    text += std::to_string(layer.id);
  }
  return text + "]";
}

// The graph's dimension 0 of every cache against the blocks the engine allocates for it.
std::string CheckBlocks(const Model& model, const OgaExtEngineGeometry& geometry) {
  size_t blocks = geometry.num_blocks;
  std::string full = model.configured_num_blocks == blocks
                         ? "engine.dynamic_batching.num_blocks is " + std::to_string(blocks)
                         : "the engine sized the KV cache to " + std::to_string(blocks) +
                               " blocks (engine.dynamic_batching.gpu_utilization_factor); set "
                               "engine.dynamic_batching.num_blocks to the graph's count";
  std::string ring = "the engine allocates " + std::to_string(geometry.window_blocks) +
                     " ring blocks for the sliding-window layers (" + std::to_string(geometry.window_ring_blocks) +
                     " per request, from model.decoder.sliding_window.window_size and search.chunk_size, for "
                     "engine.dynamic_batching.max_batch_size " +
                     std::to_string(geometry.max_batch_size) + " requests)";
  for (const CacheTensor& tensor : model.cache_tensors) {
    size_t expected = tensor.ring ? geometry.window_blocks : blocks;
    if (tensor.dims[0] >= 0 && static_cast<size_t>(tensor.dims[0]) != expected)
      return DimensionMismatch(model, tensor.name, 0, tensor.dims[0], tensor.ring ? ring : full);
  }
  return "";
}

// Validates and binds one step's fixed state (the Python executor's _bind_fixed_state); returns
// an error text or "".
std::string BindFixedState(PagedEngine* engine, const OgaExtStepInputs* in) {
  const Model& model = *engine->model;
  const std::vector<FixedState>& tensors = model.fixed_states;
  if (tensors.empty())
    return in->num_fixed_states ? "the step passes fixed_state, but the decoder has no fixed state tensors" : "";
  bool capture = model.fixed_capture;
  if (in->num_fixed_states != tensors.size() || in->fixed_state_inputs == nullptr ||
      in->fixed_state_outputs == nullptr) {
    std::string names;
    for (const FixedState& t : tensors) names += (names.empty() ? "" : ", ") + t.input;
    return "the decoder has " + std::to_string(tensors.size()) + " fixed state tensors (" + names +
           "), but the step passes " + std::to_string(in->fixed_state_inputs ? in->num_fixed_states : 0) +
           (capture ? " (input, output, capture) address triples" : " (input, output) address pairs");
  }
  const size_t rows = in->num_rows, tokens = in->num_tokens;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const FixedState& t = tensors[i];
    auto source = reinterpret_cast<uintptr_t>(in->fixed_state_inputs[i]);
    auto target = reinterpret_cast<uintptr_t>(in->fixed_state_outputs[i]);
    uintptr_t snapshot = in->fixed_state_captures ? reinterpret_cast<uintptr_t>(in->fixed_state_captures[i]) : 0;
    if (!source || !target) return "fixed state '" + t.input + "': a null address";
    if (capture && !snapshot)
      return "fixed state '" + t.input + "': the decoder writes every packed token's state to '" + t.capture +
             "', but the step passes no capture address";
    if (snapshot && !capture)
      return "fixed state '" + t.input + "': the step passes a capture address, but the decoder has no per-token "
             "state output ('" + t.output + ".per_token')";
    const uintptr_t size = rows * t.row_bytes;
    if (source < target + size && target < source + size)
      return "fixed state '" + t.input + "': the output '" + t.output +
             "' overlaps the input (a step must not write over the state it reads)";
    if (capture) {
      const uintptr_t captured = tokens * t.row_bytes;
      // the input is still being read while captures are written, and two outputs sharing memory
      // would leave either one's rows undefined
      const std::pair<const std::string*, uintptr_t> others[2] = {{&t.input, source}, {&t.output, target}};
      for (const auto& [name, address] : others)
        if (snapshot < address + size && address < snapshot + captured)
          return "fixed state '" + t.input + "': the capture '" + t.capture + "' overlaps '" + *name + "'";
    }
    int64_t shape[BoundSlot::kMaxRank];
    shape[0] = static_cast<int64_t>(rows);
    std::copy(t.row_dims.begin(), t.row_dims.end(), shape + 1);
    const size_t rank = 1 + t.row_dims.size();
    BoundSlot* slots = &engine->fixed_slots[3 * i];
    engine->binding.Bind(&slots[0], t.input, t.type, reinterpret_cast<const void*>(source), shape, rank, false);
    engine->binding.Bind(&slots[1], t.output, t.type, reinterpret_cast<const void*>(target), shape, rank, true);
    if (capture) {
      // one row per packed token: rebound whenever the address or the token count changes
      shape[0] = static_cast<int64_t>(tokens);
      engine->binding.Bind(&slots[2], t.capture, t.type, reinterpret_cast<const void*>(snapshot), shape, rank, true);
    }
  }
  return "";
}

}  // namespace

Engine* OpenPagedEngine(Model* model, const OgaExtEngineGeometry& geometry, OgaExtExecutionStatus* status,
                        std::string* message) {
  *status = OgaExtExecutionStatus_Fatal;
  *message = CheckBlocks(*model, geometry);
  if (!message->empty()) return nullptr;
  if (!model->block_table_windowed.empty() && !(geometry.window_blocks && geometry.window_ring_blocks)) {
    *message = model->path + ": the decoder keeps its sliding-window layers " + LayerList(*model) +
               " in a ring of blocks ('" + model->block_table_windowed +
               "'), but the engine allocated no window blocks (window_blocks " + std::to_string(geometry.window_blocks) +
               ", window_ring_blocks " + std::to_string(geometry.window_ring_blocks) +
               "); the ring needs dynamic batching with search.chunk_size > 0.";
    return nullptr;
  }
  PagedEngine* engine = new PagedEngine(model);
  const size_t element = ElementSize(model->cache_type);
  for (const Layer& layer : model->layers) {
    const int64_t blocks = static_cast<int64_t>(layer.ring ? geometry.window_blocks : geometry.num_blocks);
    const int64_t shape[4] = {blocks, static_cast<int64_t>(model->block_size), static_cast<int64_t>(model->kv_heads),
                              static_cast<int64_t>(model->head_size)};
    const size_t bytes = static_cast<size_t>(blocks) * model->block_size * model->kv_heads * model->head_size * element;
    const std::string* pairs[2][2] = {{&layer.past_key, &layer.present_key}, {&layer.past_value, &layer.present_value}};
    for (const auto& pair : pairs) {
      void* cache = AllocateZeroed(bytes);
      if (cache == nullptr) {
        delete engine;
        *status = OgaExtExecutionStatus_CapacityExceeded;
        *message = "cannot allocate the KV cache: " + std::to_string(bytes) + " bytes for " + *pair[0];
        return nullptr;
      }
      engine->caches.push_back(cache);
      engine->binding.Bind(nullptr, *pair[0], model->cache_type, cache, shape, 4, false);
      engine->binding.Bind(nullptr, *pair[1], model->cache_type, cache, shape, 4, true);
    }
  }
  engine->logits_rows = model->per_token_logits ? geometry.max_scheduled_tokens : geometry.max_batch_size;
  engine->logits = AllocateZeroed(engine->logits_rows * model->vocab * ElementSize(model->logits_type));
  if (engine->logits == nullptr) {
    delete engine;
    *status = OgaExtExecutionStatus_CapacityExceeded;
    *message = "cannot allocate the logits buffer";
    return nullptr;
  }
  if (!model->logits_block_maxima.empty()) {
    engine->maxima_stride = (model->vocab + kLogitsBlock - 1) / kLogitsBlock;
    engine->block_maxima =
        static_cast<float*>(AllocateZeroed(engine->logits_rows * engine->maxima_stride * sizeof(float)));
    if (engine->block_maxima == nullptr) {
      delete engine;
      *status = OgaExtExecutionStatus_CapacityExceeded;
      *message = "cannot allocate the logits block maxima buffer";
      return nullptr;
    }
  }
  *status = OgaExtExecutionStatus_Ok;
  return engine;
}

OgaExtExecutionStatus ExecutePaged(Engine* base, const OgaExtStepInputs* in, OgaExtStepOutputs* out,
                                   std::string* message) {
  PagedEngine* engine = static_cast<PagedEngine*>(base);
  const Model& model = *engine->model;
  const int64_t tokens = static_cast<int64_t>(in->num_tokens), rows = static_cast<int64_t>(in->num_rows);
  const size_t logits_rows = model.per_token_logits ? in->num_tokens : in->num_rows;
  *message = BindFixedState(engine, in);
  if (!message->empty()) return OgaExtExecutionStatus_Fatal;
  if (!model.block_table_windowed.empty() && in->block_table_windowed == nullptr) {
    *message = "the decoder keeps sliding-window layers in a ring, but the step has no '" + model.block_table_windowed +
               "'";
    return OgaExtExecutionStatus_Fatal;
  }
  if (logits_rows > engine->logits_rows) {
    *message = "the step needs " + std::to_string(logits_rows) + " logits rows, above the " +
               std::to_string(engine->logits_rows) + " allocated";
    return OgaExtExecutionStatus_Fatal;
  }
  HostBinding& binding = engine->binding;
  BoundSlot* slots = engine->slots;
  int64_t shape[2] = {tokens, 0};
  binding.Bind(&slots[kInputIds], model.input_ids, ortapi::kInt64, in->input_ids, shape, 1, false);
  shape[0] = rows + 1;
  binding.Bind(&slots[kCumulative], model.cumulative, ortapi::kInt32, in->cumulative_sequence_lengths, shape, 1, false);
  shape[0] = rows;
  binding.Bind(&slots[kPast], model.past, ortapi::kInt32, in->past_sequence_lengths, shape, 1, false);
  shape[1] = static_cast<int64_t>(in->block_table_columns);
  binding.Bind(&slots[kBlockTable], model.block_table, ortapi::kInt32, in->block_table, shape, 2, false);
  if (!model.block_table_windowed.empty())
    binding.Bind(&slots[kBlockTableWindowed], model.block_table_windowed, ortapi::kInt32, in->block_table_windowed,
                 shape, 2, false);
  if (!model.position_ids.empty()) {
    shape[0] = tokens;
    binding.Bind(&slots[kPositionIds], model.position_ids, ortapi::kInt64, in->position_ids, shape, 1, false);
  }
  if (!model.attention_metadata.empty()) {
    shape[0] = 3;
    binding.Bind(&slots[kMetadata], model.attention_metadata, ortapi::kInt32, in->attention_metadata, shape, 1, false);
  }
  if (!model.logits_indices.empty()) {
    shape[0] = rows;
    binding.Bind(&slots[kLogitsIndices], model.logits_indices, ortapi::kInt32, in->logits_indices, shape, 1, false);
  }
  shape[0] = static_cast<int64_t>(logits_rows);
  shape[1] = static_cast<int64_t>(model.vocab);
  binding.Bind(&slots[kLogits], model.logits, model.logits_type, engine->logits, shape, 2, true);
  if (engine->block_maxima != nullptr) {
    shape[1] = static_cast<int64_t>(engine->maxima_stride);
    binding.Bind(&slots[kBlockMaxima], model.logits_block_maxima, ortapi::kFloat, engine->block_maxima, shape, 2,
                 true);
  }
  if (OrtStatus* status = binding.Run()) return RunFailure(model.api, status, message);
  out->logits = engine->logits;
  out->logits_type = model.logits_type == ortapi::kFloat16 ? OgaExtLogitsType_Float16 : OgaExtLogitsType_Float32;
  out->logits_rows = logits_rows;
  out->logits_row_stride = model.vocab;
  out->logits_on_device = 0;
  out->logits_block_maxima = engine->block_maxima;
  out->logits_block_maxima_stride = engine->maxima_stride;
  return OgaExtExecutionStatus_Ok;
}

}  // namespace native
