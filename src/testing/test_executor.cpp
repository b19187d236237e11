// The built-in deterministic test executor.
//
// It behaves like a real paged decoder where it matters for the engine: it writes one cache slot per
// packed token through the block table, reads the previous position back through the block table,
// and produces logits that depend on the whole prefix only through what the cache holds. A state
// chain stands in for attention:
//
//   state(-1) = 0x6F6761
//   state(p)  = Mix64(state(p-1) ^ token_p * G ^ p << 32)
//   score(s, v) = Mix64(s + (v + 1) * G) >> 40          (24 bits)
//   logits[v] = score(s, v) / 2^24 * 8 - 4            (exact in float32)
//
// with G = 0x9E3779B97F4A7C15 and Mix64 the splitmix64 finalizer (src/base/mix64.h). So the greedy
// stream of a sequence is fixed by its tokens alone, whatever the batch, and a slot that does not
// hold the position the block table claims (a packing, reservation or commit bug) is reported as a
// fatal failure.
//
// With "test_model": {"windowed_block_table": true} and model.decoder.sliding_window, it also keeps
// a sliding-window ring as a real ring layer would: every token is written to its ring slot through
// block_table_windowed, and a query at position p must find each of the W - 1 positions before it
// still in its ring slot (an undersized ring, or a ring table that maps a position elsewhere, is a
// fatal failure).
//
// With fixed_conv / fixed_recurrent groups in model.decoder.state_groups it is a hybrid decoder:
// one fixed state tensor per fixed binding, rows of "test_model": {"fixed_state_row_words": W}
// 8-byte words (default 2). The row of tensor t after position p is
//
//   word 0 = Mix64(state(p) + (t + 1) * G),  word 1 = p + 1 (tokens baked in),  word k = word 0 ^ k
//
// and the zero row means no tokens. Every step checks each row's fixed input against the state its
// paged chain reads back (a stale bank, a wrong slot, a missing zero row or a misordered row is a
// fatal failure) and writes the state after the row's last packed token to the fixed output; with
// "fixed_state_capture": true it also writes every packed token's state to the capture buffers.
//
// With "cuda_graph": true it declares the CUDA graph capability and checks every graph step as a
// captured graph would need it: one token per row, a bucketed block-table width, attention bounds
// that hold for the step, and one (rows, columns) shape per graph id for the engine's lifetime.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "base/errors.h"
#include "base/mix64.h"
#include "engine/model.h"
#include "base/random_stream.h"
#include "sampling/sampler.h"

namespace oga {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kInitialState = 0x6F6761ull;

// A simulated device for engine-owned state ("device_ops": true): host memory behind the
// OgaExtDeviceOps table, with copies that fault phase DeviceCopy can fail and counters tests read.
struct SimulatedDevice {
  std::shared_ptr<FaultInjector> faults;
  size_t live_allocations = 0;
  uint64_t copies = 0;
  uint64_t synchronizations = 0;
  uint64_t reads = 0;
  uint64_t sampled_rows = 0;
};

void* DeviceAllocate(void* context, size_t bytes) {
  auto* device = static_cast<SimulatedDevice*>(context);
  void* memory = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (memory != nullptr) ++device->live_allocations;
  return memory;
}

void DeviceRelease(void* context, void* memory) {
  --static_cast<SimulatedDevice*>(context)->live_allocations;
  std::free(memory);
}

// A device fault of kind Interrupted reports an interruption (the device intact); any other a failure.
int32_t FaultReturn(OgaExtExecutionStatus fault) {
  return fault == OgaExtExecutionStatus_Interrupted ? static_cast<int32_t>(OgaExtExecutionStatus_Interrupted) : 1;
}

int32_t DeviceCopy(void* context, size_t count, const void* const* sources, void* const* destinations, size_t bytes,
                   char* message, size_t capacity) {
  auto* device = static_cast<SimulatedDevice*>(context);
  if (const OgaExtExecutionStatus fault = device->faults->Consult(OgaExtFaultPhase_DeviceCopy);
      fault != OgaExtExecutionStatus_Ok) {
    if (capacity > 0) std::snprintf(message, capacity, "simulated device: copy of %zu rows failed", count);
    return FaultReturn(fault);
  }
  for (size_t i = 0; i < count; ++i) std::memcpy(destinations[i], sources[i], bytes);
  device->copies += count;
  return 0;
}

int32_t DeviceFillZero(void*, void* memory, size_t bytes, char*, size_t) {
  std::memset(memory, 0, bytes);
  return 0;
}

int32_t DeviceSynchronize(void* context, char*, size_t) {
  ++static_cast<SimulatedDevice*>(context)->synchronizations;
  return 0;
}

// Logits on the simulated device are stored negated, so an engine that dereferenced them instead
// of reading them back (or sampling on the device) would pick the worst tokens.
float EncodeDeviceLogit(float logit) { return -logit; }
float DecodeDeviceLogit(float stored) { return -stored; }

int32_t DeviceRead(void* context, size_t count, const void* const* sources, void* const* destinations, size_t bytes,
                   char* message, size_t capacity) {
  auto* device = static_cast<SimulatedDevice*>(context);
  if (const OgaExtExecutionStatus fault = device->faults->Consult(OgaExtFaultPhase_DeviceCopy);
      fault != OgaExtExecutionStatus_Ok) {
    if (capacity > 0) std::snprintf(message, capacity, "simulated device: read of %zu rows failed", count);
    return FaultReturn(fault);
  }
  for (size_t i = 0; i < count; ++i) {
    const float* source = static_cast<const float*>(sources[i]);
    float* destination = static_cast<float*>(destinations[i]);
    for (size_t k = 0; k < bytes / sizeof(float); ++k) destination[k] = DecodeDeviceLogit(source[k]);
  }
  device->reads += count;
  return 0;
}

// The device sampler's reference: the host sampler's own functions over a decoded copy of each row
// (the contract forbids touching the executor's logits).
int32_t DeviceSample(void* context, const OgaExtDeviceSampling* sampling, char* message, size_t capacity) {
  auto* device = static_cast<SimulatedDevice*>(context);
  if (const OgaExtExecutionStatus fault = device->faults->Consult(OgaExtFaultPhase_DeviceSample);
      fault != OgaExtExecutionStatus_Ok) {
    if (capacity > 0) std::snprintf(message, capacity, "simulated device: sampling kernel launch failed (injected)");
    return FaultReturn(fault);
  }
  const size_t vocab = sampling->vocab_size;
  SamplingScratch scratch(vocab);
  std::vector<float> row(vocab);
  const std::vector<int32_t> eos_ids(sampling->eos_ids, sampling->eos_ids + sampling->num_eos);
  for (size_t r = 0; r < sampling->num_rows; ++r) {
    const float* stored = static_cast<const float*>(sampling->logits) +
                          static_cast<size_t>(sampling->logits_rows[r]) * sampling->logits_row_stride;
    for (size_t v = 0; v < vocab; ++v) row[v] = DecodeDeviceLogit(stored[v]);
    LoadLogits(LogitsRow{row.data(), OgaExtLogitsType_Float32}, vocab, scratch.logits.data());
    const std::vector<int32_t> history(sampling->history_tokens + sampling->history_offsets[r],
                                       sampling->history_tokens + sampling->history_offsets[r + 1]);
    SamplingParams params;
    params.greedy = sampling->temperatures[r] == 0.0f;
    params.temperature = sampling->temperatures[r];
    params.top_k = sampling->top_ks[r];
    params.top_p = sampling->top_ps[r];
    params.repetition_penalty = sampling->repetition_penalties[r];
    ProcessLogits(history, eos_ids, sampling->mask_eos[r] != 0, params, scratch);
    if (params.greedy) {
      sampling->tokens[r] = ArgMaxProcessed(scratch);
    } else {
      RandomStream stream(sampling->seeds[r], sampling->counters[r]);
      sampling->tokens[r] = SampleProcessed(params, stream, scratch);
    }
  }
  device->sampled_rows += sampling->num_rows;
  return 0;
}

struct TestModelData {
  ModelConfig config;
  std::shared_ptr<FaultInjector> faults;
  std::vector<size_t> fixed_row_bytes;  // per fixed tensor (OgaExtModelExecutor.fixed_state_row_bytes)
  SimulatedDevice device;
  OgaExtDeviceOps device_ops{};
};

struct CacheSlot {
  int64_t position;  // -1: never written
  uint64_t state;
};

struct TestEngineState {
  OgaExtEngineGeometry geometry{};
  std::vector<CacheSlot> slots;  // [num_blocks * block_size]
  std::vector<int64_t> ring;     // [window_blocks * block_size] positions; empty without a ring
  size_t window = 0;
  std::vector<float> logits;     // [max_scheduled_tokens, vocab]
  bool per_token_logits = false;
  std::vector<std::pair<size_t, size_t>> graphs;  // graph id -> (rows, columns); (0, 0) = unseen
  bool cuda_graph = false;
  bool device_logits = false;  // logits stored encoded, reported as device memory
  size_t max_block_table_columns = 0;  // the executor's own limit (0 = none)
  size_t fixed_states = 0;     // fixed tensors
  size_t fixed_row_words = 0;  // 8-byte words per fixed row
  bool fixed_capture = false;
  std::shared_ptr<FaultInjector> faults;
};

void WriteMessage(char* message, size_t capacity, const std::string& text) {
  if (capacity == 0) return;
  std::snprintf(message, capacity, "%s", text.c_str());
}

OgaExtExecutionStatus OpenEngine(void* model_data, const OgaExtEngineGeometry* geometry, void** engine_data,
                                 char* message, size_t message_capacity) {
  auto* model = static_cast<TestModelData*>(model_data);
  try {
    auto state = std::make_unique<TestEngineState>();
    state->geometry = *geometry;
    state->slots.assign(geometry->num_blocks * geometry->block_size, CacheSlot{-1, 0});
    if (model->config.test_windowed_block_table) {
      if (geometry->window_blocks == 0 || !model->config.decoder.sliding_window) {
        WriteMessage(message, message_capacity, "test executor: a windowed model needs the engine's ring geometry");
        return OgaExtExecutionStatus_Fatal;
      }
      state->ring.assign(geometry->window_blocks * geometry->block_size, -1);
      state->window = static_cast<size_t>(model->config.decoder.sliding_window->window_size);
    }
    state->per_token_logits = model->config.test_per_token_logits;
    state->fixed_states = model->fixed_row_bytes.size();
    state->fixed_row_words = static_cast<size_t>(model->config.test_fixed_state_row_words);
    state->fixed_capture = model->config.test_fixed_state_capture;
    state->cuda_graph = model->config.test_cuda_graph;
    state->device_logits = model->config.test_device_logits;
    state->max_block_table_columns = static_cast<size_t>(model->config.test_max_block_table_columns);
    if (state->fixed_states > 0 && geometry->fixed_state_slots == 0) {
      WriteMessage(message, message_capacity, "test executor: a hybrid model needs the engine's fixed-state pool");
      return OgaExtExecutionStatus_Fatal;
    }
    // One logits row per packed token for per-token decoders, otherwise one per request.
    const size_t logits_rows = state->per_token_logits ? geometry->max_scheduled_tokens : geometry->max_batch_size;
    state->logits.assign(logits_rows * geometry->vocab_size, 0.0f);
    state->faults = model->faults;
    *engine_data = state.release();
    return OgaExtExecutionStatus_Ok;
  } catch (const std::bad_alloc&) {
    WriteMessage(message, message_capacity, "test executor: cannot allocate its paged token store");
    return OgaExtExecutionStatus_CapacityExceeded;
  }
}

// The ring slot of `position` in row `r`, or -1 when the windowed table does not map it.
int64_t RingSlot(const TestEngineState& engine, const OgaExtStepInputs& in, size_t r, int64_t position) {
  const size_t block_size = engine.geometry.block_size;
  const size_t column = static_cast<size_t>(position) / block_size;
  if (in.block_table_windowed == nullptr || column >= in.block_table_columns) return -1;
  const int32_t block = in.block_table_windowed[r * in.block_table_columns + column];
  if (block < 0 || static_cast<size_t>(block) >= engine.geometry.window_blocks) return -1;
  return static_cast<int64_t>(static_cast<size_t>(block) * block_size + static_cast<size_t>(position) % block_size);
}

// Writes the row's `count` positions from `first` into the ring, then checks that each of them
// still finds the W - 1 positions before it.
std::string CheckRing(TestEngineState& engine, const OgaExtStepInputs& in, size_t r, int64_t first, int64_t count) {
  for (int64_t position = first; position < first + count; ++position) {
    const int64_t slot = RingSlot(engine, in, r, position);
    if (slot < 0) {
      return "test executor: block_table_windowed of row " + std::to_string(r) + " does not map position " +
             std::to_string(position);
    }
    engine.ring[static_cast<size_t>(slot)] = position;
  }
  for (int64_t position = first; position < first + count; ++position) {
    for (int64_t k = std::max<int64_t>(0, position - static_cast<int64_t>(engine.window) + 1); k < position; ++k) {
      const int64_t slot = RingSlot(engine, in, r, k);
      if (slot < 0 || engine.ring[static_cast<size_t>(slot)] != k) {
        return "test executor: row " + std::to_string(r) + " at position " + std::to_string(position) +
               " lost window position " + std::to_string(k) + " from its sliding-window ring";
      }
    }
  }
  return std::string();
}

// The fixed row of tensor `tensor` after position `position` whose chain state is `state`.
void WriteFixedRow(uint64_t* row, size_t words, size_t tensor, uint64_t state, int64_t position) {
  row[0] = Mix64(state + (static_cast<uint64_t>(tensor) + 1) * kGolden);
  row[1] = static_cast<uint64_t>(position + 1);
  for (size_t k = 2; k < words; ++k) row[k] = row[0] ^ k;
}

// Checks row `r`'s fixed inputs: zeros before its first token, else the state after position past - 1.
std::string CheckFixedInputs(const TestEngineState& engine, const OgaExtStepInputs& in, size_t r, int64_t past,
                             uint64_t state) {
  const size_t words = engine.fixed_row_words;
  std::vector<uint64_t> expected(words, 0);
  for (size_t t = 0; t < engine.fixed_states; ++t) {
    if (past > 0) WriteFixedRow(expected.data(), words, t, state, past - 1);
    const uint64_t* row = static_cast<const uint64_t*>(in.fixed_state_inputs[t]) + r * words;
    if (std::memcmp(row, expected.data(), words * sizeof(uint64_t)) != 0) {
      return "test executor: fixed state " + std::to_string(t) + " of row " + std::to_string(r) + " holds " +
             std::to_string(row[1]) + " tokens (or other contents), expected the state after " + std::to_string(past) +
             " tokens";
    }
  }
  return std::string();
}

// A graph step as a captured graph needs it; "" when it is one (or an eager step with exact bounds).
std::string CheckGraphStep(TestEngineState& engine, const OgaExtStepInputs& in) {
  const int64_t block_size = static_cast<int64_t>(engine.geometry.block_size);
  int64_t max_kv = 0;
  size_t max_query = 0;
  for (size_t r = 0; r < in.num_rows; ++r) {
    const size_t query = static_cast<size_t>(in.cumulative_sequence_lengths[r + 1] - in.cumulative_sequence_lengths[r]);
    max_query = std::max(max_query, query);
    max_kv = std::max<int64_t>(max_kv, in.past_sequence_lengths[r] + static_cast<int64_t>(query));
  }
  const int32_t* bounds = in.attention_metadata;
  if (in.graph_id < 0) {
    if (bounds[0] != static_cast<int32_t>(max_query) || bounds[1] != max_kv || bounds[2] != max_kv) {
      return "test executor: an eager step's attention bounds are not exact";
    }
    return std::string();
  }
  if (!engine.cuda_graph) return "test executor: a graph step for an executor without CUDA graphs";
  if (max_query != 1 || in.num_tokens != in.num_rows) return "test executor: a graph step is not a pure decode";
  const size_t columns = in.block_table_columns;
  const bool power_of_two = columns >= 8 && (columns & (columns - 1)) == 0;
  const size_t widest = engine.max_block_table_columns > 0
                            ? std::min(engine.max_block_table_columns, engine.geometry.max_block_table_columns)
                            : engine.geometry.max_block_table_columns;
  if (columns > widest) return "test executor: a graph step is wider than the executor's widest block table";
  if (!power_of_two && columns != widest) {
    return "test executor: graph step columns " + std::to_string(columns) + " are not a graph bucket";
  }
  if (bounds[0] != 1 || bounds[1] != static_cast<int64_t>(columns) * block_size || bounds[2] < 1 ||
      bounds[2] > max_kv || max_kv > bounds[1]) {
    return "test executor: a graph step's attention bounds [" + std::to_string(bounds[0]) + ", " +
           std::to_string(bounds[1]) + ", " + std::to_string(bounds[2]) + "] do not hold for its KV length " +
           std::to_string(max_kv);
  }
  const size_t id = static_cast<size_t>(in.graph_id);
  if (engine.graphs.size() <= id) engine.graphs.resize(id + 1, {0, 0});
  std::pair<size_t, size_t>& shape = engine.graphs[id];
  if (shape.first == 0) {
    for (const auto& other : engine.graphs) {
      if (other.first == in.num_rows && other.second == columns) {
        return "test executor: two graph ids for one (rows, columns) shape";
      }
    }
    shape = {in.num_rows, columns};
  } else if (shape.first != in.num_rows || shape.second != columns) {
    return "test executor: graph id " + std::to_string(id) + " replayed with another shape";
  }
  return std::string();
}

void WriteLogits(uint64_t state, size_t vocab, float* row) {
  for (size_t v = 0; v < vocab; ++v) {
    uint64_t score = Mix64(state + (static_cast<uint64_t>(v) + 1) * kGolden) >> 40;
    row[v] = static_cast<float>(score) * (8.0f / 16777216.0f) - 4.0f;
  }
}

OgaExtExecutionStatus Execute(void* engine_data, const OgaExtStepInputs* in, OgaExtStepOutputs* out, char* message,
                              size_t message_capacity) {
  auto* engine = static_cast<TestEngineState*>(engine_data);
  const size_t block_size = engine->geometry.block_size;
  const size_t vocab = engine->geometry.vocab_size;
  const size_t num_blocks = engine->geometry.num_blocks;
  size_t selected_row = 0;
  if (const std::string failure = CheckGraphStep(*engine, *in); !failure.empty()) {
    WriteMessage(message, message_capacity, failure);
    return OgaExtExecutionStatus_Fatal;
  }
  if (in->num_fixed_states != engine->fixed_states || (engine->fixed_states > 0 &&
      (in->fixed_state_inputs == nullptr || in->fixed_state_outputs == nullptr ||
       (engine->fixed_capture && in->fixed_state_captures == nullptr)))) {
    WriteMessage(message, message_capacity, "test executor: the step binds " + std::to_string(in->num_fixed_states) +
                                                " fixed state tensors, the model has " + std::to_string(engine->fixed_states));
    return OgaExtExecutionStatus_Fatal;
  }
  for (size_t r = 0; r < in->num_rows; ++r) {
    const int32_t* table = in->block_table + r * in->block_table_columns;
    const size_t begin = static_cast<size_t>(in->cumulative_sequence_lengths[r]);
    const size_t end = static_cast<size_t>(in->cumulative_sequence_lengths[r + 1]);
    const int64_t past = in->past_sequence_lengths[r];
    auto slot_at = [&](int64_t position) -> CacheSlot* {
      size_t column = static_cast<size_t>(position) / block_size;
      if (column >= in->block_table_columns) return nullptr;
      int32_t block = table[column];
      if (block < 0 || static_cast<size_t>(block) >= num_blocks) return nullptr;
      return &engine->slots[static_cast<size_t>(block) * block_size + static_cast<size_t>(position) % block_size];
    };
    uint64_t state = kInitialState;
    if (past > 0) {
      CacheSlot* previous = slot_at(past - 1);
      if (previous == nullptr || previous->position != past - 1) {
        WriteMessage(message, message_capacity,
                     "test executor: row " + std::to_string(r) + " reads position " + std::to_string(past - 1) +
                         " from a cache slot that " +
                         (previous == nullptr ? std::string("the block table does not map")
                                              : "holds position " + std::to_string(previous->position)));
        return OgaExtExecutionStatus_Fatal;
      }
      state = previous->state;
    }
    if (engine->fixed_states > 0) {
      const std::string failure = CheckFixedInputs(*engine, *in, r, past, state);
      if (!failure.empty()) {
        WriteMessage(message, message_capacity, failure);
        return OgaExtExecutionStatus_Fatal;
      }
    }
    if (!engine->ring.empty()) {
      // As a ring layer does: the step's keys are written first, then every query reads its window.
      const std::string failure = CheckRing(*engine, *in, r, past, static_cast<int64_t>(end - begin));
      if (!failure.empty()) {
        WriteMessage(message, message_capacity, failure);
        return OgaExtExecutionStatus_Fatal;
      }
    }
    for (size_t i = begin; i < end; ++i) {
      const int64_t position = past + static_cast<int64_t>(i - begin);
      if (in->position_ids[i] != position) {
        WriteMessage(message, message_capacity,
                     "test executor: position_ids[" + std::to_string(i) + "] is " + std::to_string(in->position_ids[i]) +
                         ", expected " + std::to_string(position));
        return OgaExtExecutionStatus_Fatal;
      }
      CacheSlot* slot = slot_at(position);
      if (slot == nullptr) {
        WriteMessage(message, message_capacity,
                     "test executor: the block table of row " + std::to_string(r) + " does not map position " +
                         std::to_string(position));
        return OgaExtExecutionStatus_Fatal;
      }
      const uint64_t token = static_cast<uint64_t>(in->input_ids[i]);
      state = Mix64(state ^ (token * kGolden) ^ (static_cast<uint64_t>(position) << 32));
      slot->position = position;
      slot->state = state;
      for (size_t t = 0; t < engine->fixed_states; ++t) {
        const size_t words = engine->fixed_row_words;
        if (engine->fixed_capture) {
          WriteFixedRow(static_cast<uint64_t*>(in->fixed_state_captures[t]) + i * words, words, t, state, position);
        }
        if (i + 1 == end) {
          WriteFixedRow(static_cast<uint64_t*>(in->fixed_state_outputs[t]) + r * words, words, t, state, position);
        }
      }
      if (engine->per_token_logits) {
        WriteLogits(state, vocab, engine->logits.data() + i * vocab);
      } else if (i + 1 == end) {
        if (static_cast<size_t>(in->logits_indices[r]) != i) {
          WriteMessage(message, message_capacity, "test executor: logits_indices does not name the last token of a row");
          return OgaExtExecutionStatus_Fatal;
        }
        WriteLogits(state, vocab, engine->logits.data() + selected_row * vocab);
        ++selected_row;
      }
    }
  }
  // Faults fire after the cache writes, as a real failure would: the engine must discard them.
  if (engine->faults) {
    OgaExtExecutionStatus fault = engine->faults->Consult(OgaExtFaultPhase_Execute);
    if (fault != OgaExtExecutionStatus_Ok) {
      WriteMessage(message, message_capacity, "injected execution fault");
      return fault;
    }
  }
  out->logits = engine->logits.data();
  out->logits_type = OgaExtLogitsType_Float32;
  out->logits_rows = engine->per_token_logits ? in->num_tokens : in->num_rows;
  out->logits_row_stride = vocab;
  if (engine->device_logits) {
    float* logits = engine->logits.data();
    for (size_t k = 0; k < out->logits_rows * vocab; ++k) logits[k] = EncodeDeviceLogit(logits[k]);
    out->logits_on_device = 1;
  }
  return OgaExtExecutionStatus_Ok;
}

void CloseEngine(void* engine_data) { delete static_cast<TestEngineState*>(engine_data); }

void ReleaseModel(void* model_data) {
  auto* model = static_cast<TestModelData*>(model_data);
  if (model->device.live_allocations != 0) {
    // Every engine released its state before the model goes: a leak is a bug worth a crash in tests.
    std::fprintf(stderr, "test executor: %zu simulated device allocations leaked\n", model->device.live_allocations);
    std::abort();
  }
  delete model;
}

}  // namespace

std::shared_ptr<Model> CreateTestModel(const std::string& config_json) {
  ModelConfig config = ParseModelConfig(config_json);
  auto faults = std::make_shared<FaultInjector>();
  auto data = std::make_unique<TestModelData>();
  data->config = config;
  data->faults = faults;
  OgaExtModelExecutor executor{};
  executor.per_token_logits = config.test_per_token_logits ? 1 : 0;
  executor.max_block_table_columns = static_cast<size_t>(config.test_max_block_table_columns);
  executor.windowed_block_table = config.test_windowed_block_table ? 1 : 0;
  for (const StateGroup& group : config.decoder.effective_state_groups) {
    if (group.kind == StateGroupKind::kPagedKv) continue;
    for (size_t i = 0; i < group.layer_ids.size(); ++i) {
      data->fixed_row_bytes.push_back(static_cast<size_t>(config.test_fixed_state_row_words) * sizeof(uint64_t));
    }
  }
  executor.num_fixed_states = data->fixed_row_bytes.size();
  executor.fixed_state_row_bytes = data->fixed_row_bytes.empty() ? nullptr : data->fixed_row_bytes.data();
  executor.fixed_state_capture = config.test_fixed_state_capture && !data->fixed_row_bytes.empty() ? 1 : 0;
  executor.cuda_graph = config.test_cuda_graph ? 1 : 0;
  if (config.test_device_ops) {
    data->device.faults = faults;
    data->device_ops.context = &data->device;
    data->device_ops.allocate = DeviceAllocate;
    data->device_ops.release = DeviceRelease;
    data->device_ops.copy = DeviceCopy;
    data->device_ops.fill_zero = DeviceFillZero;
    data->device_ops.synchronize = DeviceSynchronize;
    if (config.test_device_logits) {
      data->device_ops.read = DeviceRead;
      if (config.test_device_sampling) data->device_ops.sample = DeviceSample;
    }
    executor.device_ops = &data->device_ops;
  } else if (config.test_device_logits) {
    throw ApiError("test_model.device_logits needs test_model.device_ops");
  }
  executor.model_data = data.get();
  executor.open_engine = OpenEngine;
  executor.execute = Execute;
  executor.close_engine = CloseEngine;
  executor.release_model = ReleaseModel;
  auto model = std::make_shared<Model>(std::move(config), executor, std::move(faults));
  data.release();  // owned by the model now
  return model;
}

}  // namespace oga
