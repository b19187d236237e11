// model.h -- a decoder's ONNX Runtime session and, once the Python side has validated it, the
// resolved names and geometry the engines bind (the executor table's model_data).
#ifndef OGA_NATIVE_EXECUTOR_MODEL_H_
#define OGA_NATIVE_EXECUTOR_MODEL_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "native_executor.h"
#include "runtime.h"

namespace native {

// Bytes of one element of an ONNX element type the executor binds, 0 for any other.
size_t ElementSize(int type);

// Copies `text` into a caller's message buffer (NUL-terminated, truncated to `capacity`).
void WriteMessage(char* message, size_t capacity, const std::string& text);

struct Layer {
  int32_t id = 0;  // logical layer id
  std::string past_key, past_value, present_key, present_value;
  bool ring = false;  // a sliding-window ring layer (paged): its caches hold the window blocks
};

struct CacheTensor {
  std::string name;
  int64_t dims[4];  // -1: symbolic
  bool ring = false;
};

struct FixedState {
  std::string input, output, capture;  // capture empty: no per-token output
  int type = 0;
  std::vector<int64_t> row_dims;
  size_t row_bytes = 0;
};

struct Model {
  // -- the session (OgaNativeSessionOpen) --
  const Runtime* runtime = nullptr;
  const OrtApi* api = nullptr;
  OrtSessionOptions* options = nullptr;  // kept with the session (it holds the custom-op domain)
  OrtSession* session = nullptr;
  OrtMemoryInfo* cpu = nullptr;          // every bound buffer is host memory
  std::string path;

  // -- the decoder (OgaNativeExecutorLoad) --
  bool is_static = false;
  std::string input_ids, position_ids, cumulative, past, block_table, block_table_windowed, attention_metadata,
      logits_indices, attention_mask, logits;
  std::string logits_block_maxima;  // "" when the graph has none
  std::vector<Layer> layers;
  int cache_type = 0;
  size_t block_size = 0, kv_heads = 0, head_size = 0;
  std::vector<CacheTensor> cache_tensors;
  size_t configured_num_blocks = 0;
  int logits_type = 0;
  size_t vocab = 0;
  bool per_token_logits = false;
  std::vector<FixedState> fixed_states;
  std::vector<size_t> fixed_row_bytes;  // OgaExtModelExecutor.fixed_state_row_bytes points here
  bool fixed_capture = false;
  bool static_rows_alone = false;  // OgaNativeDecoderSpec.static_rows_alone

  // Summed over the model's engines (each runs on its own owner thread).
  std::atomic<uint64_t> run_ns{0};
  std::atomic<uint64_t> binds{0};

  ~Model();
};

// Creates the session (throws OrtError or std::runtime_error).
Model* OpenSession(const Runtime* runtime, const OgaNativeSessionSpec& spec);
// Copies the validated decoder into `model` (throws std::runtime_error for a spec the executor
// cannot run).
void Configure(Model* model, const OgaNativeDecoderSpec& spec);
// The session's inputs and outputs as JSON (see OgaNativeSessionDescribe).
std::string Describe(const Model& model);

}  // namespace native

#endif  // OGA_NATIVE_EXECUTOR_MODEL_H_
