#include "model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace native {

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

Model::~Model() {
  if (api == nullptr) return;
  if (session) Entry<void (*)(OrtSession*)>(api, kReleaseSession)(session);
  if (options) Entry<void (*)(OrtSessionOptions*)>(api, kReleaseSessionOptions)(options);
  if (cpu) Entry<void (*)(OrtMemoryInfo*)>(api, kReleaseMemoryInfo)(cpu);
}

Model* OpenSession(const Runtime* runtime, const OgaNativeSessionSpec& spec) {
  const OrtApi* api = runtime->api;
  Model* model = new Model();
  try {
    model->runtime = runtime;
    model->api = api;
    model->path = spec.model_path ? spec.model_path : "";
    Check(api, Entry<OrtStatus* (*)(OrtSessionOptions**)>(api, kCreateSessionOptions)(&model->options));
    OrtSessionOptions* options = model->options;
    if (spec.ortops_library != nullptr) {
      // The handle stays open for the process (the library serves every session that registered it).
      void* handle = nullptr;
      Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, const char*, void**)>(api, kRegisterCustomOpsLibrary)(
                     options, spec.ortops_library, &handle));
    }
    // As the Python executor: ORT's intra-op threads stop spinning after a run, leaving the cores
    // to the engine's token selection.
    Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, const char*, const char*)>(api, kAddSessionConfigEntry)(
                   options, "session.force_spinning_stop", "1"));
    if (spec.log_id != nullptr)
      Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, const char*)>(api, kSetSessionLogId)(options, spec.log_id));
    if (spec.intra_op_num_threads >= 0)
      Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, int)>(api, kSetIntraOpNumThreads)(
                     options, spec.intra_op_num_threads));
    if (spec.inter_op_num_threads >= 0)
      Check(api, Entry<OrtStatus* (*)(OrtSessionOptions*, int)>(api, kSetInterOpNumThreads)(
                     options, spec.inter_op_num_threads));
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

namespace {

std::string Text(const char* value) { return value ? std::string(value) : std::string(); }

std::string Required(const char* value, const char* what) {
  if (value == nullptr || *value == '\0') throw std::runtime_error(std::string("the decoder spec names no ") + what);
  return value;
}

}  // namespace

void Configure(Model* model, const OgaNativeDecoderSpec& spec) {
  model->layers.clear();
  model->cache_tensors.clear();
  model->fixed_states.clear();
  model->fixed_row_bytes.clear();
  model->is_static = spec.static_batching != 0;
  model->input_ids = Required(spec.input_ids, "input_ids");
  model->logits = Required(spec.logits, "logits");
  model->position_ids = Text(spec.position_ids);
  if (model->is_static) {
    model->attention_mask = Required(spec.attention_mask, "attention_mask");
  } else {
    model->cumulative = Required(spec.cumulative_sequence_lengths, "cumulative_sequence_lengths");
    model->past = Required(spec.past_sequence_lengths, "past_sequence_lengths");
    model->block_table = Required(spec.block_table, "block_table");
    model->block_table_windowed = Text(spec.block_table_windowed);
    model->attention_metadata = Text(spec.attention_metadata);
    model->logits_indices = Text(spec.logits_indices);
    model->logits_block_maxima = Text(spec.logits_block_maxima);
  }
  if (spec.num_layers == 0) throw std::runtime_error("the decoder spec has no cache layers");
  for (size_t i = 0; i < spec.num_layers; ++i)
    model->layers.push_back({spec.layer_ids != nullptr ? spec.layer_ids[i] : static_cast<int32_t>(i),
                             Text(spec.past_key_names[i]), Text(spec.past_value_names[i]),
                             Text(spec.present_key_names[i]), Text(spec.present_value_names[i]),
                             spec.ring_layers != nullptr && spec.ring_layers[i] != 0});
  model->cache_type = spec.cache_element_type;
  model->block_size = spec.block_size;
  model->kv_heads = spec.kv_heads;
  model->head_size = spec.head_size;
  for (size_t i = 0; i < spec.num_cache_tensors; ++i) {
    const OgaNativeCacheTensor& t = spec.cache_tensors[i];
    CacheTensor tensor{Text(t.name), {t.dims[0], t.dims[1], t.dims[2], t.dims[3]}, t.ring != 0};
    model->cache_tensors.push_back(tensor);
  }
  model->configured_num_blocks = spec.configured_num_blocks;
  model->logits_type = spec.logits_element_type;
  model->vocab = spec.vocab_size;
  model->per_token_logits = spec.per_token_logits != 0;
  if (ElementSize(model->cache_type) == 0 || ElementSize(model->logits_type) == 0)
    throw std::runtime_error("unsupported cache or logits element type");
  for (size_t i = 0; i < spec.num_fixed_states; ++i) {
    const OgaNativeFixedState& f = spec.fixed_states[i];
    if (f.row_rank == 0 || f.row_rank > OGA_NATIVE_MAX_ROW_RANK || ElementSize(f.element_type) == 0)
      throw std::runtime_error("fixed state '" + Text(f.input) + "': unsupported element type or row rank");
    FixedState state{Text(f.input), Text(f.output), Text(f.capture), f.element_type,
                     std::vector<int64_t>(f.row_dims, f.row_dims + f.row_rank), f.row_bytes};
    model->fixed_states.push_back(state);
    model->fixed_row_bytes.push_back(f.row_bytes);
  }
  model->fixed_capture = !model->fixed_states.empty() && !model->fixed_states[0].capture.empty();
  model->static_rows_alone = spec.static_rows_alone != 0;
  for (const FixedState& f : model->fixed_states)
    if (f.capture.empty() == model->fixed_capture)
      throw std::runtime_error("a decoder captures the per-token state of every fixed tensor or of none");
}

namespace {

void AppendJsonString(std::string& out, const char* text) {
  out += '"';
  for (const char* p = text; *p; ++p) {
    unsigned char c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

// One input's or output's JSON object.
std::string DescribeTensor(const OrtApi* api, OrtSession* session, OrtAllocator* allocator, bool output,
                           size_t index) {
  char* name = nullptr;
  Check(api, Entry<OrtStatus* (*)(const OrtSession*, size_t, OrtAllocator*, char**)>(
                 api, output ? kSessionGetOutputName : kSessionGetInputName)(session, index, allocator, &name));
  std::string json = std::string("{\"kind\": \"") + (output ? "output" : "input") + "\", \"name\": ";
  AppendJsonString(json, name);
  Check(api, Entry<OrtStatus* (*)(OrtAllocator*, void*)>(api, kAllocatorFree)(allocator, name));
  OrtTypeInfo* info = nullptr;
  Check(api, Entry<OrtStatus* (*)(const OrtSession*, size_t, OrtTypeInfo**)>(
                 api, output ? kSessionGetOutputTypeInfo : kSessionGetInputTypeInfo)(session, index, &info));
  try {
    const OrtTensorTypeAndShapeInfo* tensor = nullptr;
    Check(api, Entry<OrtStatus* (*)(const OrtTypeInfo*, const OrtTensorTypeAndShapeInfo**)>(
                   api, kCastTypeInfoToTensorInfo)(info, &tensor));
    if (tensor == nullptr) {  // a sequence, map or optional: the decoder contract has none
      json += ", \"type\": 0, \"dims\": []}";
    } else {
      int type = 0;
      size_t rank = 0;
      Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int*)>(api, kGetTensorElementType)(tensor,
                                                                                                           &type));
      Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, size_t*)>(api, kGetDimensionsCount)(tensor,
                                                                                                           &rank));
      std::vector<int64_t> dims(rank);
      std::vector<const char*> symbols(rank, nullptr);
      Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)>(api, kGetDimensions)(
                     tensor, dims.data(), rank));
      Check(api, Entry<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, const char**, size_t)>(
                     api, kGetSymbolicDimensions)(tensor, symbols.data(), rank));
      json += ", \"type\": " + std::to_string(type) + ", \"dims\": [";
      for (size_t i = 0; i < rank; ++i) {
        if (i) json += ", ";
        if (dims[i] >= 0)
          json += std::to_string(dims[i]);
        else if (symbols[i] != nullptr && *symbols[i] != '\0')
          AppendJsonString(json, symbols[i]);
        else
          json += "null";
      }
      json += "]}";
    }
  } catch (...) {
    Entry<void (*)(OrtTypeInfo*)>(api, kReleaseTypeInfo)(info);
    throw;
  }
  Entry<void (*)(OrtTypeInfo*)>(api, kReleaseTypeInfo)(info);
  return json;
}

}  // namespace

std::string Describe(const Model& model) {
  const OrtApi* api = model.api;
  OrtAllocator* allocator = nullptr;
  Check(api, Entry<OrtStatus* (*)(OrtAllocator**)>(api, kGetAllocatorWithDefaultOptions)(&allocator));
  size_t inputs = 0, outputs = 0;
  Check(api, Entry<OrtStatus* (*)(const OrtSession*, size_t*)>(api, kSessionGetInputCount)(model.session, &inputs));
  Check(api, Entry<OrtStatus* (*)(const OrtSession*, size_t*)>(api, kSessionGetOutputCount)(model.session, &outputs));
  std::string json = "[";
  for (size_t i = 0; i < inputs + outputs; ++i) {
    if (i) json += ", ";
    json += i < inputs ? DescribeTensor(api, model.session, allocator, false, i)
                       : DescribeTensor(api, model.session, allocator, true, i - inputs);
  }
  return json + "]";
}

}  // namespace native
