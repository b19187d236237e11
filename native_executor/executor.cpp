// The native executor: a paged CPU decoder's session (Model, the table's model_data) and, per
// engine, its caches, logits and IOBinding (Engine, the table's engine_data). Everything the
// Python host path (oga/onnx_executor.py OnnxEngineExecutor) does per step, without Python:
// the engine's packed buffers are bound where they are, by address; each cache is allocated once,
// zeroed, and bound as both its past input and its present output (the graph updates it in place);
// the logits land in a buffer allocated once at the row limit; a buffer whose address and shape did
// not change since the previous step is not bound again.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "native_executor.h"
#include "runtime.h"

using namespace native;

namespace {

size_t ElementSize(int type) {
  switch (type) {
    case ortapi::kFloat: return 4;
    case ortapi::kFloat16: return 2;
    case ortapi::kInt32: return 4;
    case ortapi::kInt64: return 8;
    default: return 0;
  }
}

void WriteMessage(char* message, size_t capacity, const std::string& text) {
  if (message == nullptr || capacity == 0) return;
  size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(message, text.data(), n);
  message[n] = '\0';
}

std::string Text(const char* value) { return value ? std::string(value) : std::string(); }

struct Layer {
  std::string past_key, past_value, present_key, present_value;
};

struct Model {
  const Runtime* runtime = nullptr;
  const OrtApi* api = nullptr;
  OrtSessionOptions* options = nullptr;  // kept with the session (it holds the custom-op domain)
  OrtSession* session = nullptr;
  OrtMemoryInfo* cpu = nullptr;          // every bound buffer is host memory
  std::string path;
  std::string input_ids, position_ids, cumulative, past, block_table, attention_metadata, logits_indices, logits;
  std::vector<Layer> layers;
  int cache_type = 0;
  size_t block_size = 0, kv_heads = 0, head_size = 0;
  std::vector<std::pair<std::string, int64_t>> cache_blocks;  // graph dimension 0 per cache tensor
  size_t configured_num_blocks = 0;
  int logits_type = 0;
  size_t vocab = 0;
  bool per_token_logits = false;
  // Summed over the model's engines (each runs on its own owner thread).
  std::atomic<uint64_t> run_ns{0};
  std::atomic<uint64_t> binds{0};

  ~Model() {
    if (api == nullptr) return;
    if (session) Entry<void (*)(OrtSession*)>(api, kReleaseSession)(session);
    if (options) Entry<void (*)(OrtSessionOptions*)>(api, kReleaseSessionOptions)(options);
    if (cpu) Entry<void (*)(OrtMemoryInfo*)>(api, kReleaseMemoryInfo)(cpu);
  }
};

// The step inputs and the logits output, each bound where the engine (or the executor) keeps it.
enum BindSlot { kInputIds, kPositionIds, kCumulative, kPast, kBlockTable, kMetadata, kLogitsIndices, kLogits,
                kBindSlots };

struct Bound {
  const void* address = nullptr;
  int64_t shape[2] = {-1, -1};
  size_t rank = 0;
};

struct Engine {
  Model* model = nullptr;
  OrtIoBinding* binding = nullptr;
  std::vector<void*> caches;
  void* logits = nullptr;
  size_t logits_rows = 0;
  Bound bound[kBindSlots];

  ~Engine() {
    const OrtApi* api = model->api;
    if (binding) Entry<void (*)(OrtIoBinding*)>(api, kReleaseIoBinding)(binding);
    for (void* cache : caches) std::free(cache);
    std::free(logits);
  }

  // Binds `name` to `count` elements of `type` at `address` with `shape`; returns at once when the
  // slot (kBindSlots: a cache, bound once) already holds that address and shape.
  void Bind(int slot, const std::string& name, int type, const void* address, const int64_t* shape, size_t rank,
            bool output) {
    if (slot < kBindSlots) {
      Bound& b = bound[slot];
      if (b.address == address && b.rank == rank && std::equal(shape, shape + rank, b.shape)) return;
    }
    const OrtApi* api = model->api;
    size_t bytes = ElementSize(type);
    for (size_t i = 0; i < rank; ++i) bytes *= static_cast<size_t>(shape[i]);
    OrtValue* value = nullptr;
    Check(api, Entry<OrtStatus* (*)(const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, int, OrtValue**)>(
                   api, kCreateTensorWithDataAsOrtValue)(model->cpu, const_cast<void*>(address), bytes, shape, rank,
                                                         type, &value));
    // The binding keeps its own reference to the tensor (over the same memory).
    OrtStatus* status = Entry<OrtStatus* (*)(OrtIoBinding*, const char*, const OrtValue*)>(
        api, output ? kBindOutput : kBindInput)(binding, name.c_str(), value);
    Entry<void (*)(OrtValue*)>(api, kReleaseValue)(value);
    Check(api, status);
    model->binds.fetch_add(1, std::memory_order_relaxed);
    if (slot < kBindSlots) {
      Bound& b = bound[slot];
      b.address = address;
      b.rank = rank;
      std::copy(shape, shape + rank, b.shape);
    }
  }
};

std::string CheckBlocks(const Model& model, size_t blocks) {
  std::string source = model.configured_num_blocks == blocks
                           ? "engine.dynamic_batching.num_blocks is " + std::to_string(blocks)
                           : "the engine sized the KV cache to " + std::to_string(blocks) +
                                 " blocks (engine.dynamic_batching.gpu_utilization_factor); set "
                                 "engine.dynamic_batching.num_blocks to the graph's count";
  for (const auto& [name, dim] : model.cache_blocks)
    if (dim >= 0 && static_cast<size_t>(dim) != blocks)
      return model.path + ": " + name + " dimension 0 is " + std::to_string(dim) + " in the graph, but " + source +
             ".";
  return "";
}

OgaExtExecutionStatus OpenEngine(void* model_data, const OgaExtEngineGeometry* geometry, void** engine_data,
                                 char* message, size_t capacity) {
  Model* model = static_cast<Model*>(model_data);
  std::string mismatch = CheckBlocks(*model, geometry->num_blocks);
  if (!mismatch.empty()) {
    WriteMessage(message, capacity, mismatch);
    return OgaExtExecutionStatus_Fatal;
  }
  Engine* engine = nullptr;
  try {
    engine = new Engine();
    engine->model = model;
    const OrtApi* api = model->api;
    Check(api, Entry<OrtStatus* (*)(OrtSession*, OrtIoBinding**)>(api, kCreateIoBinding)(model->session,
                                                                                         &engine->binding));
    const int64_t shape[4] = {static_cast<int64_t>(geometry->num_blocks), static_cast<int64_t>(model->block_size),
                              static_cast<int64_t>(model->kv_heads), static_cast<int64_t>(model->head_size)};
    size_t bytes = ElementSize(model->cache_type);
    for (int64_t d : shape) bytes *= static_cast<size_t>(d);
    for (const Layer& layer : model->layers) {
      const std::string* pairs[2][2] = {{&layer.past_key, &layer.present_key},
                                        {&layer.past_value, &layer.present_value}};
      for (const auto& pair : pairs) {
        const std::string& past = *pair[0];
        const std::string& present = *pair[1];
        // calloc: zeroed without touching the pages, like numpy.zeros on the Python path
        void* cache = std::calloc(1, bytes ? bytes : 1);
        if (cache == nullptr) {
          delete engine;
          WriteMessage(message, capacity,
                       "cannot allocate the KV cache: " + std::to_string(bytes) + " bytes for " + past);
          return OgaExtExecutionStatus_CapacityExceeded;
        }
        engine->caches.push_back(cache);
        engine->Bind(kBindSlots, past, model->cache_type, cache, shape, 4, false);
        engine->Bind(kBindSlots, present, model->cache_type, cache, shape, 4, true);
      }
    }
    engine->logits_rows = model->per_token_logits ? geometry->max_scheduled_tokens : geometry->max_batch_size;
    engine->logits = std::calloc(engine->logits_rows * model->vocab, ElementSize(model->logits_type));
    if (engine->logits == nullptr) {
      delete engine;
      WriteMessage(message, capacity, "cannot allocate the logits buffer");
      return OgaExtExecutionStatus_CapacityExceeded;
    }
  } catch (const std::bad_alloc&) {
    delete engine;
    WriteMessage(message, capacity, "cannot allocate the KV cache: out of memory");
    return OgaExtExecutionStatus_CapacityExceeded;
  } catch (const std::exception& error) {
    delete engine;
    WriteMessage(message, capacity, error.what());
    return ClassifyFailure(error.what());
  }
  *engine_data = engine;
  return OgaExtExecutionStatus_Ok;
}

OgaExtExecutionStatus Execute(void* engine_data, const OgaExtStepInputs* in, OgaExtStepOutputs* out, char* message,
                              size_t capacity) {
  Engine* engine = static_cast<Engine*>(engine_data);
  Model* model = engine->model;
  if (in->num_fixed_states > 0) {
    WriteMessage(message, capacity, "the step passes fixed_state, but the decoder has no fixed state tensors");
    return OgaExtExecutionStatus_Fatal;
  }
  const int64_t tokens = static_cast<int64_t>(in->num_tokens), rows = static_cast<int64_t>(in->num_rows);
  const size_t logits_rows = model->per_token_logits ? in->num_tokens : in->num_rows;
  if (logits_rows > engine->logits_rows) {
    WriteMessage(message, capacity, "the step needs " + std::to_string(logits_rows) + " logits rows, above the " +
                                        std::to_string(engine->logits_rows) + " allocated");
    return OgaExtExecutionStatus_Fatal;
  }
  try {
    int64_t shape[2] = {tokens, 0};
    engine->Bind(kInputIds, model->input_ids, ortapi::kInt64, in->input_ids, shape, 1, false);
    shape[0] = rows + 1;
    engine->Bind(kCumulative, model->cumulative, ortapi::kInt32, in->cumulative_sequence_lengths, shape, 1, false);
    shape[0] = rows;
    engine->Bind(kPast, model->past, ortapi::kInt32, in->past_sequence_lengths, shape, 1, false);
    shape[1] = static_cast<int64_t>(in->block_table_columns);
    engine->Bind(kBlockTable, model->block_table, ortapi::kInt32, in->block_table, shape, 2, false);
    if (!model->position_ids.empty()) {
      shape[0] = tokens;
      engine->Bind(kPositionIds, model->position_ids, ortapi::kInt64, in->position_ids, shape, 1, false);
    }
    if (!model->attention_metadata.empty()) {
      shape[0] = 3;
      engine->Bind(kMetadata, model->attention_metadata, ortapi::kInt32, in->attention_metadata, shape, 1, false);
    }
    if (!model->logits_indices.empty()) {
      shape[0] = rows;
      engine->Bind(kLogitsIndices, model->logits_indices, ortapi::kInt32, in->logits_indices, shape, 1, false);
    }
    shape[0] = static_cast<int64_t>(logits_rows);
    shape[1] = static_cast<int64_t>(model->vocab);
    engine->Bind(kLogits, model->logits, model->logits_type, engine->logits, shape, 2, true);
  } catch (const std::exception& error) {
    WriteMessage(message, capacity, error.what());
    return ClassifyFailure(error.what());
  }
  const OrtApi* api = model->api;
  auto start = std::chrono::steady_clock::now();
  OrtStatus* status = Entry<OrtStatus* (*)(OrtSession*, const OrtRunOptions*, const OrtIoBinding*)>(
      api, kRunWithBinding)(model->session, nullptr, engine->binding);
  model->run_ns.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                    std::chrono::steady_clock::now() - start)
                                                    .count()),
                          std::memory_order_relaxed);
  if (status != nullptr) {
    // The text onnxruntime's Python binding raises from run_with_iobinding for the same status.
    const char* reason = Entry<const char* (*)(const OrtStatus*)>(api, kGetErrorMessage)(status);
    std::string text = std::string("RuntimeError: Error in execution: ") + (reason ? reason : "");
    Entry<void (*)(OrtStatus*)>(api, kReleaseStatus)(status);
    WriteMessage(message, capacity, text);
    return ClassifyFailure(text);
  }
  out->logits = engine->logits;
  out->logits_type = model->logits_type == ortapi::kFloat16 ? OgaExtLogitsType_Float16 : OgaExtLogitsType_Float32;
  out->logits_rows = logits_rows;
  out->logits_row_stride = model->vocab;
  out->logits_on_device = 0;
  return OgaExtExecutionStatus_Ok;
}

void CloseEngine(void* engine_data) { delete static_cast<Engine*>(engine_data); }

void ReleaseModel(void* model_data) { delete static_cast<Model*>(model_data); }

// Reads a session input's or output's name, element type and dimensions.
std::string DescribeTensor(const OrtApi* api, OrtSession* session, OrtAllocator* allocator, bool output,
                           size_t index) {
  char* name = nullptr;
  Check(api, Entry<OrtStatus* (*)(const OrtSession*, size_t, OrtAllocator*, char**)>(
                 api, output ? kSessionGetOutputName : kSessionGetInputName)(session, index, allocator, &name));
  std::string line = std::string(output ? "output " : "input ") + name;
  Check(api, Entry<OrtStatus* (*)(OrtAllocator*, void*)>(api, kAllocatorFree)(allocator, name));
  OrtTypeInfo* info = nullptr;
  Check(api, Entry<OrtStatus* (*)(const OrtSession*, size_t, OrtTypeInfo**)>(
                 api, output ? kSessionGetOutputTypeInfo : kSessionGetInputTypeInfo)(session, index, &info));
  try {
    const OrtTensorTypeAndShapeInfo* tensor = nullptr;
    Check(api, Entry<OrtStatus* (*)(const OrtTypeInfo*, const OrtTensorTypeAndShapeInfo**)>(
                   api, kCastTypeInfoToTensorInfo)(info, &tensor));
    int type = 0;
    size_t rank = 0;
    Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int*)>(api, kGetTensorElementType)(tensor,
                                                                                                         &type));
    Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, size_t*)>(api, kGetDimensionsCount)(tensor,
                                                                                                         &rank));
    std::vector<int64_t> dims(rank);
    Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)>(api, kGetDimensions)(
                   tensor, dims.data(), rank));
    line += " " + std::to_string(type) + " ";
    for (size_t i = 0; i < rank; ++i) line += (i ? "," : "") + std::to_string(dims[i]);
  } catch (...) {
    Entry<void (*)(OrtTypeInfo*)>(api, kReleaseTypeInfo)(info);
    throw;
  }
  Entry<void (*)(OrtTypeInfo*)>(api, kReleaseTypeInfo)(info);
  return line + "\n";
}

Model* CreateModel(const Runtime* runtime, const OgaNativeDecoderSpec* spec) {
  const OrtApi* api = runtime->api;
  Model* model = new Model();
  try {
    model->runtime = runtime;
    model->api = api;
    model->path = Text(spec->model_path);
    model->input_ids = Text(spec->input_ids);
    model->position_ids = Text(spec->position_ids);
    model->cumulative = Text(spec->cumulative_sequence_lengths);
    model->past = Text(spec->past_sequence_lengths);
    model->block_table = Text(spec->block_table);
    model->attention_metadata = Text(spec->attention_metadata);
    model->logits_indices = Text(spec->logits_indices);
    model->logits = Text(spec->logits);
    for (size_t i = 0; i < spec->num_layers; ++i)
      model->layers.push_back({Text(spec->past_key_names[i]), Text(spec->past_value_names[i]),
                               Text(spec->present_key_names[i]), Text(spec->present_value_names[i])});
    model->cache_type = spec->cache_element_type;
    model->block_size = spec->block_size;
    model->kv_heads = spec->kv_heads;
    model->head_size = spec->head_size;
    for (size_t i = 0; i < spec->num_cache_tensors; ++i)
      model->cache_blocks.emplace_back(Text(spec->cache_tensor_names[i]), spec->cache_tensor_blocks[i]);
    model->configured_num_blocks = spec->configured_num_blocks;
    model->logits_type = spec->logits_element_type;
    model->vocab = spec->vocab_size;
    model->per_token_logits = spec->per_token_logits != 0;
    if (!ElementSize(model->cache_type) || !ElementSize(model->logits_type))
      throw std::runtime_error("unsupported cache or logits element type");

    Check(api, Entry<OrtStatus* (*)(OrtSessionOptions**)>(api, kCreateSessionOptions)(&model->options));
    OrtSessionOptions* options = model->options;
    if (spec->ortops_library != nullptr) {
      // The handle stays open for the process (the library serves every session that registered it).
      void* handle = nullptr;
      Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, const char*, void**)>(api, kRegisterCustomOpsLibrary)(
                     options, spec->ortops_library, &handle));
    }
    // As the Python executor: ORT's intra-op threads stop spinning after a run, leaving the cores
    // to the engine's token selection.
    Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, const char*, const char*)>(api, kAddSessionConfigEntry)(
                   options, "session.force_spinning_stop", "1"));
    if (spec->log_id != nullptr)
      Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, const char*)>(api, kSetSessionLogId)(options,
                                                                                             spec->log_id));
    if (spec->intra_op_num_threads >= 0)
      Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, int)>(api, kSetIntraOpNumThreads)(
                     options, spec->intra_op_num_threads));
    if (spec->inter_op_num_threads >= 0)
      Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, int)>(api, kSetInterOpNumThreads)(
                     options, spec->inter_op_num_threads));
    Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, int)>(api, kSetSessionGraphOptimizationLevel)(options,
                                                                                                     kEnableAll));
    Check(api, Entry<OrtStatus* (*)(const OrtEnv*, const char*, const OrtSessionOptions*, OrtSession**)>(
                   api, kCreateSession)(runtime->env, model->path.c_str(), options, &model->session));
    Check(api, Entry<OrtStatus* (*)(int, int, OrtMemoryInfo**)>(api, kCreateCpuMemoryInfo)(
                   kDeviceAllocator, kMemTypeDefault, &model->cpu));
  } catch (...) {
    delete model;
    throw;
  }
  return model;
}

}  // namespace

extern "C" {

OGA_NATIVE_EXPORT size_t OgaNativeDecoderSpecSize(void) { return sizeof(OgaNativeDecoderSpec); }

OGA_NATIVE_EXPORT uint32_t OgaNativeExecutorApiVersion(void) { return kApiVersion; }

OGA_NATIVE_EXPORT int32_t OgaNativeRuntimeOpen(const char* library_path, uint32_t api_version, char* message,
                                               size_t message_capacity) {
  std::string error;
  if (OpenRuntime(Text(library_path), api_version, &error) == nullptr) {
    WriteMessage(message, message_capacity, error);
    return 1;
  }
  return 0;
}

OGA_NATIVE_EXPORT const char* OgaNativeRuntimeVersion(void) {
  const Runtime* runtime = CurrentRuntime();
  return runtime ? runtime->version.c_str() : "";
}

OGA_NATIVE_EXPORT int32_t OgaNativeExecutorCheckApi(char* message, size_t message_capacity) {
  const Runtime* runtime = CurrentRuntime();
  if (runtime == nullptr) {
    WriteMessage(message, message_capacity, "ONNX Runtime is not open (OgaNativeRuntimeOpen)");
    return 1;
  }
  const OrtApi* api = runtime->api;
  std::string failure;
  OrtMemoryInfo* cpu = nullptr;
  OrtValue* value = nullptr;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  try {
    // CreateStatus / GetErrorCode / GetErrorMessage / ReleaseStatus
    OrtStatus* status = Entry<OrtStatus* (*)(int, const char*)>(api, kCreateStatus)(kInvalidArgument, "oga check");
    int code = Entry<int (*)(const OrtStatus*)>(api, kGetErrorCode)(status);
    std::string text = Entry<const char* (*)(const OrtStatus*)>(api, kGetErrorMessage)(status);
    Entry<void (*)(OrtStatus*)>(api, kReleaseStatus)(status);
    if (code != kInvalidArgument || text != "oga check")
      throw std::runtime_error("CreateStatus/GetErrorCode/GetErrorMessage returned code " + std::to_string(code) +
                               " and text '" + text + "'");
    // CreateCpuMemoryInfo / MemoryInfoGetName
    Check(api, Entry<OrtStatus* (*)(int, int, OrtMemoryInfo**)>(api, kCreateCpuMemoryInfo)(kDeviceAllocator,
                                                                                          kMemTypeDefault, &cpu));
    const char* name = nullptr;
    Check(api, Entry<OrtStatus* (*)(const OrtMemoryInfo*, const char**)>(api, kMemoryInfoGetName)(cpu, &name));
    if (name == nullptr || std::string(name) != "Cpu")
      throw std::runtime_error(std::string("MemoryInfoGetName returned '") + (name ? name : "(null)") + "'");
    // CreateTensorWithDataAsOrtValue / GetTensorMutableData / GetTensorTypeAndShape /
    // GetTensorElementType / GetDimensionsCount / GetDimensions / ReleaseTensorTypeAndShapeInfo / ReleaseValue
    int32_t data[6] = {0, 1, 2, 3, 4, 5};
    const int64_t shape[2] = {2, 3};
    Check(api, Entry<OrtStatus* (*)(const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, int, OrtValue**)>(
                   api, kCreateTensorWithDataAsOrtValue)(cpu, data, sizeof(data), shape, 2, ortapi::kInt32, &value));
    void* address = nullptr;
    Check(api, Entry<OrtStatus* (*)(OrtValue*, void**)>(api, kGetTensorMutableData)(value, &address));
    if (address != data) throw std::runtime_error("GetTensorMutableData does not return the tensor's memory");
    Check(api, Entry<OrtStatus* (*)(const OrtValue*, OrtTensorTypeAndShapeInfo**)>(api, kGetTensorTypeAndShape)(
                   value, &info));
    int type = 0;
    size_t rank = 0;
    int64_t dims[2] = {0, 0};
    Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int*)>(api, kGetTensorElementType)(info,
                                                                                                         &type));
    Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, size_t*)>(api, kGetDimensionsCount)(info,
                                                                                                         &rank));
    if (rank == 2)
      Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)>(api, kGetDimensions)(
                     info, dims, 2));
    if (type != ortapi::kInt32 || rank != 2 || dims[0] != 2 || dims[1] != 3)
      throw std::runtime_error("a [2, 3] int32 tensor reads back as type " + std::to_string(type) + ", rank " +
                               std::to_string(rank) + ", [" + std::to_string(dims[0]) + ", " +
                               std::to_string(dims[1]) + "]");
    // GetAllocatorWithDefaultOptions / AllocatorFree: freeing NULL through the default allocator
    OrtAllocator* allocator = nullptr;
    Check(api, Entry<OrtStatus* (*)(OrtAllocator**)>(api, kGetAllocatorWithDefaultOptions)(&allocator));
    if (allocator == nullptr) throw std::runtime_error("GetAllocatorWithDefaultOptions returned NULL");
  } catch (const std::exception& error) {
    failure = error.what();
  }
  if (info) Entry<void (*)(OrtTensorTypeAndShapeInfo*)>(api, kReleaseTensorTypeAndShapeInfo)(info);
  if (value) Entry<void (*)(OrtValue*)>(api, kReleaseValue)(value);
  if (cpu) Entry<void (*)(OrtMemoryInfo*)>(api, kReleaseMemoryInfo)(cpu);
  if (!failure.empty()) {
    WriteMessage(message, message_capacity, "ONNX Runtime C API check failed: " + failure);
    return 1;
  }
  return 0;
}

OGA_NATIVE_EXPORT int32_t OgaNativeExecutorLoad(const OgaNativeDecoderSpec* spec, OgaExtModelExecutor* executor,
                                                char* message, size_t message_capacity) {
  const Runtime* runtime = CurrentRuntime();
  if (runtime == nullptr) {
    WriteMessage(message, message_capacity, "ONNX Runtime is not open (OgaNativeRuntimeOpen)");
    return 1;
  }
  Model* model = nullptr;
  try {
    model = CreateModel(runtime, spec);
  } catch (const std::exception& error) {
    WriteMessage(message, message_capacity, error.what());
    return 1;
  }
  executor->model_data = model;
  executor->open_engine = OpenEngine;
  executor->execute = Execute;
  executor->close_engine = CloseEngine;
  executor->release_model = ReleaseModel;
  executor->execute_static = nullptr;
  return 0;
}

OGA_NATIVE_EXPORT size_t OgaNativeExecutorDescribe(void* model_data, char* text, size_t capacity) {
  Model* model = static_cast<Model*>(model_data);
  const OrtApi* api = model->api;
  std::string description;
  try {
    OrtAllocator* allocator = nullptr;
    Check(api, Entry<OrtStatus* (*)(OrtAllocator**)>(api, kGetAllocatorWithDefaultOptions)(&allocator));
    size_t inputs = 0, outputs = 0;
    Check(api, Entry<OrtStatus* (*)(const OrtSession*, size_t*)>(api, kSessionGetInputCount)(model->session,
                                                                                            &inputs));
    Check(api, Entry<OrtStatus* (*)(const OrtSession*, size_t*)>(api, kSessionGetOutputCount)(model->session,
                                                                                             &outputs));
    for (size_t i = 0; i < inputs; ++i) description += DescribeTensor(api, model->session, allocator, false, i);
    for (size_t i = 0; i < outputs; ++i) description += DescribeTensor(api, model->session, allocator, true, i);
  } catch (const std::exception& error) {
    WriteMessage(text, capacity, error.what());
    return 0;
  }
  WriteMessage(text, capacity, description);
  return description.size() + 1;
}

OGA_NATIVE_EXPORT uint64_t OgaNativeModelRunNs(const void* model_data) {
  return static_cast<const Model*>(model_data)->run_ns.load();
}

OGA_NATIVE_EXPORT uint64_t OgaNativeModelBindCount(const void* model_data) {
  return static_cast<const Model*>(model_data)->binds.load();
}

}  // extern "C"
