/*
 * oga_ext.h -- oga additions to the OGA 0.18 C API (prefix OgaExt, so they cannot collide with
 * OGA names): the model-executor interface, model loading, token text for stop strings and
 * guidance, the built-in deterministic test model, and introspection used by the Python binding and
 * by tests.
 *
 * Conventions are those of oga.h (results, NULL handling, [owner], borrowed views, copied inputs).
 * Sections of the seed are cited as seed: "<title>" (see oga.h: onnxruntime-genai's design document
 * docs/paged_attention_engine.md in github.com/microsoft/onnxruntime-genai, not part of oga).
 */
#ifndef OGA_OGA_EXT_H_
#define OGA_OGA_EXT_H_

#include "oga/oga.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Error kinds
 *
 * Every failed call's OgaResult carries the kind of the core's error behind it, so a binding can
 * raise a typed error without parsing the message (the Python binding's OgaError.kind).
 * ------------------------------------------------------------------------------------------- */
typedef uint32_t OgaExtErrorKind;
#define OgaExtErrorKind_None 0u        /* no failure (a NULL result) */
#define OgaExtErrorKind_Api 1u         /* a caller mistake or an illegal state (wrong thread, closed
                                          handle, invalid argument, an unhealthy engine's refusal):
                                          the call changed nothing */
#define OgaExtErrorKind_Contract 2u    /* the engine's collaborators disagreed (an internal bug) */
#define OgaExtErrorKind_Retryable 3u   /* a step failed in a way the next attempt may not */
#define OgaExtErrorKind_Device 4u      /* the executor's device failed an operation */
#define OgaExtErrorKind_Interrupted 5u /* a callback reported the calling thread interrupted */
#define OgaExtErrorKind_OutOfMemory 6u /* an allocation failed (the result is a static object that
                                          OgaDestroyResult leaves alone) */
#define OgaExtErrorKind_Internal 7u    /* any other exception inside the core */

/* The kind of `result`'s failure; OgaExtErrorKind_None for NULL. Any thread. */
OGA_EXPORT OgaExtErrorKind OGA_API_CALL OgaExtResultGetErrorKind(const OgaResult* result);

/* ---------------------------------------------------------------------------------------------
 * Model executor interface
 *
 * The engine core never runs a model itself. It packs one step (VarlenDecoderIO layout, see
 * OgaExtStepInputs; seed: "One dynamic step in detail") and hands it to an executor through this
 * table of callbacks. Implementations: oga's native ONNX Runtime executor (C++, native_executor/;
 * the default for decoders on the CPU execution provider), the Python ONNX Runtime executor
 * (oga/executor/, called through trampolines in the Cython binding oga/_trampolines.pxi; decoders
 * on a device, and the fallback when the native library cannot be used), the built-in test
 * executor (OgaExtCreateTestModel), and any table passed to OgaExtCreateModelWithExecutor.
 *
 * Threading: open_engine runs inside OgaCreateEngine; execute, execute_static and the
 * OgaExtDeviceOps operations inside OgaEngineRun (device memory is also allocated inside
 * OgaCreateEngine and released inside OgaDestroyEngine); close_engine inside OgaDestroyEngine: all
 * on the engine owner thread. release_model runs wherever the model's last reference goes
 * (OgaDestroyModel, OgaDestroyEngine, OgaDestroyGeneratorParams, or a failed model creation), on
 * any thread. The core never takes or releases a Python GIL: a callback runs in whatever GIL state
 * its caller left (the Python binding releases the GIL around model, engine and request creation,
 * Run and BeginTurn, but holds it while destroying engines and models), so a Python executor must
 * acquire it in a way that also works when it is already held (PyGILState_Ensure, Cython's `with
 * gil`). A callback must not call the engine's [owner] functions (see oga.h). Every `message`
 * buffer takes a NUL-terminated reason of at most `message_capacity` bytes; the engine quotes it in
 * the resulting error.
 * ------------------------------------------------------------------------------------------- */
typedef uint32_t OgaExtExecutionStatus;
#define OgaExtExecutionStatus_Ok 0u
#define OgaExtExecutionStatus_Retryable 1u         /* step rolled back; engine stays healthy */
#define OgaExtExecutionStatus_CapacityExceeded 2u  /* out of memory; step rolled back; healthy */
#define OgaExtExecutionStatus_Fatal 3u             /* unknown failure; engine becomes unhealthy */
/* The calling thread was interrupted while the callback ran (the Python binding returns it when
 * Python code inside the callback raised a BaseException that is not an Exception, such as
 * KeyboardInterrupt from a signal handler): nothing is wrong with the model or the device, the
 * caller wants control back. From execute / execute_static (and from an OgaExtDeviceOps operation,
 * see there): the step is rolled back exactly as for Retryable (a Retryable event with
 * OgaErrorCode_RetryableExecution is retained, the engine stays healthy) and OgaEngineRun returns
 * at once, successfully, delivering no event, so its caller can act on the interruption (the
 * Python binding raises it from Engine.run); the next Run delivers the retained event. From the
 * other callbacks (open_engine, the model and token-table loaders) it is a failure like any other
 * non-Ok status: the call that ran the callback fails and changes nothing. Values above it are
 * Fatal. */
#define OgaExtExecutionStatus_Interrupted 4u

typedef uint32_t OgaExtLogitsType;
#define OgaExtLogitsType_Float32 0u
#define OgaExtLogitsType_Float16 1u

/* Paged-cache geometry the engine decided at creation; the executor allocates its cache tensors
 * ([num_blocks, block_size, ...] per layer) from it, once. */
typedef struct OgaExtEngineGeometry {
  size_t block_size;
  size_t num_blocks;
  size_t max_batch_size;        /* max rows per step */
  size_t max_scheduled_tokens;  /* max packed tokens per step */
  size_t max_block_table_columns;
  size_t vocab_size;
  /* Static batching only (block_size == 0): tokens one row's contiguous cache holds
   * (search.max_length). 0 on the dynamic path. */
  size_t max_sequence_length;
  /* Sliding-window ring (model.decoder.sliding_window with block_table_windowed): ring blocks per
   * request R = ceil((C + W - 1) / block_size), and the size of the separate window block pool the
   * ring layers' caches hold ([window_blocks, block_size, ...] per ring layer). 0 = no ring. */
  size_t window_ring_blocks;
  size_t window_blocks;
  /* Fixed decoder state (hybrid models): request-state slots the engine's fixed-state pool holds
   * (max_batch_size); 0 = the model has no fixed state. The engine owns that memory itself. */
  size_t fixed_state_slots;
} OgaExtEngineGeometry;

/* One packed step. Arrays live in engine-owned buffers preallocated at the configured limits;
 * they are valid only during the execute callback. Rows are in scheduler order. */
typedef struct OgaExtStepInputs {
  size_t num_rows;
  size_t num_tokens;
  const int64_t* input_ids;                   /* [num_tokens] unprocessed tokens, rows concatenated */
  const int64_t* position_ids;                /* [num_tokens] past_sequence_lengths[r] + j */
  const int32_t* cumulative_sequence_lengths; /* [num_rows + 1] row boundaries in input_ids */
  const int32_t* past_sequence_lengths;       /* [num_rows] committed KV length = first write slot */
  const int32_t* block_table;                 /* [num_rows, block_table_columns] row-major; -1 pads */
  size_t block_table_columns;
  const int32_t* attention_metadata;          /* [3] max_query_len, max_kv_len, max_kv_len lower bound */
  const int32_t* logits_indices;              /* [num_rows] packed token index whose logits row is needed */
  int32_t graph_eligible;                     /* 1: pure decode, one token per row */
  /* [num_rows, block_table_columns] the ring layers' table: entry j is the row's ring block j mod R,
   * so position p lives in ring slot p mod (R * block_size). NULL without a ring. */
  const int32_t* block_table_windowed;
  /* Fixed decoder state (hybrid models; seed: "Fixed request-state pools"), one entry per fixed
   * tensor in the order of OgaExtModelExecutor.fixed_state_row_bytes. Each input is [num_rows, row]
   * contiguous memory: the committed state of every row (zeros for a newly admitted request); each
   * output is [num_rows, row] memory the step writes the state after the row's last packed token
   * into, and never overlaps an input. fixed_state_direct = 1 when they are views of the engine's
   * persistent state banks (a contiguous resident interval), 0 when gathered / staged copies. With
   * OgaExtModelExecutor.fixed_state_capture, fixed_state_captures[t] is [num_tokens, row]: the state
   * after every packed token (for replaying a partially accepted draft proposal); NULL otherwise. All
   * NULL / 0 for a model without fixed state. */
  size_t num_fixed_states;
  const void* const* fixed_state_inputs;
  void* const* fixed_state_outputs;
  void* const* fixed_state_captures;
  int32_t fixed_state_direct;
  /* CUDA graphs (executors with OgaExtModelExecutor.cuda_graph): -1 = run eagerly; otherwise the
   * identity of the graph to capture or replay, one per (num_rows, block_table_columns): such a
   * step is a pure decode (one token per row), its block_table_columns is the bucket -- the next
   * power of two of at least 8 columns, capped at the configured maximum, the rows -1 padded -- and
   * attention_metadata holds bounds valid for every replay of that graph: [1, columns * block_size,
   * lower bound], the lower bound 1 for the smallest (or a capacity-clamped) bucket, else
   * (preceding power of two * block_size) + 1. -1 for executors without the capability, for models
   * with fixed state, and for a decode step in which some row owns more blocks than its KV needs. */
  int64_t graph_id;
} OgaExtStepInputs;

/* One step of a static (contiguous-cache) batch: every resident row takes part, right-padded.
 * Row r's cache holds attention_mask[r] ones worth of tokens after the step; the logits it needs
 * are those of position logits_positions[r] of its query, and its real tokens are the first
 * logits_positions[r] + 1 of its query. Valid only during execute_static. */
typedef struct OgaExtStaticStepInputs {
  size_t batch_size;
  size_t sequence_length;        /* query tokens per row (prefill: longest prompt; decode: 1) */
  size_t total_sequence_length;  /* attention_mask width */
  const int64_t* input_ids;      /* [batch_size, sequence_length], pad_token_id after a row's tokens */
  const int64_t* attention_mask; /* [batch_size, total_sequence_length]: ones, then zeros */
  const int32_t* logits_positions; /* [batch_size] */
  /* [batch_size, sequence_length]: the position of each query token in its row's sequence (the
   * padding after a row's tokens continues the count), for graphs with a position_ids input. */
  const int64_t* position_ids;
  /* 1: the rows start empty (a new batch's prefill, or its retry): fixed decoder state the
   * executor keeps per row starts from zeros. 0: every row continues from its state. */
  int32_t new_batch;
} OgaExtStaticStepInputs;

/* Filled by execute. `logits` must stay valid until the next execute or close_engine. Either
 * one row per packed token (logits_rows == num_tokens) or one row per request
 * (logits_rows == num_rows, the rows logits_indices names). */
typedef struct OgaExtStepOutputs {
  const void* logits;
  OgaExtLogitsType logits_type;
  size_t logits_rows;
  size_t logits_row_stride; /* elements between rows; >= vocab_size */
  /* 1: `logits` is a device address on the executor's device (OgaExtModelExecutor.device_ops must
   * then provide `read`, and `sample` to select on the device). The engine selects the tokens of
   * rows whose policy the device sampler supports through `sample` and reads back only the logits
   * rows it selects on the host (guidance, no-repeat n-grams, draft verification, a row the device
   * sampler left without a candidate). The executor must not modify the logits before the next
   * execute. 0: host memory. */
  int32_t logits_on_device;
  /* Optional (NULL: none; host float32 logits only): for each logits row, the largest logit of every
   * block of OGA_EXT_LOGITS_BLOCK logits (the last block may be shorter), NaN ignored, -inf when no
   * logit of the block exceeds -inf; row i's ceil(vocab_size / OGA_EXT_LOGITS_BLOCK) maxima start at
   * logits_block_maxima + i * logits_block_maxima_stride. Greedy selection then reads a row's maxima
   * and its winning block instead of the whole row (the LM head computes them while each block is
   * still in cache: oga.LogitsHead). Valid as long as `logits`. */
  const float* logits_block_maxima;
  size_t logits_block_maxima_stride;
} OgaExtStepOutputs;

/* The block of OgaExtStepOutputs.logits_block_maxima. */
#define OGA_EXT_LOGITS_BLOCK 1024

/* One batched token selection over device logits (OgaExtDeviceOps.sample). Every array is host
 * memory of num_rows entries (unless said otherwise), valid only during the call. Row i reads logits
 * row logits_rows[i] and is processed exactly as the engine's host sampler (src/sampling/sampler.h, the
 * definitive implementation) does it: every EOS id set to -inf when mask_eos[i]; then, when
 * repetition_penalties[i] != 1, every distinct token of history_tokens[history_offsets[i] ..
 * history_offsets[i + 1]) penalized (positive logits divided, others multiplied); then, when
 * temperatures[i] is 0, the lowest index of the largest logit (no draw), else temperature, top_k
 * (0 = off), top_p (1 = off) and one draw u from Philox4x32-10 with key seeds[i] at counter
 * counters[i] (see OgaExtPhilox4x32_10), the kept candidates walked in index order. The sampler must
 * not modify `logits` (process a copy): the engine may read a row back afterwards. */
typedef struct OgaExtDeviceSampling {
  size_t num_rows;
  const void* logits; /* device address: OgaExtStepOutputs.logits */
  OgaExtLogitsType logits_type;
  size_t logits_row_stride;
  size_t vocab_size;
  const int32_t* logits_rows;
  const float* temperatures;          /* 0 = greedy */
  const int32_t* top_ks;
  const float* top_ps;
  const uint64_t* seeds;
  const uint64_t* counters;
  const int32_t* mask_eos;            /* 1: the row's turn is below its minimum length */
  const int32_t* eos_ids;             /* [num_eos] */
  size_t num_eos;
  const float* repetition_penalties;  /* 1 = none */
  const int64_t* history_offsets;     /* [num_rows + 1] */
  const int32_t* history_tokens;      /* [history_offsets[num_rows]] each row's sequence, in order */
  int32_t* tokens;                    /* out: the selected id, -1 when no candidate is left */
} OgaExtDeviceSampling;

/* Device memory operations, for state the engine core owns on the executor's device (the fixed-state
 * pool's banks and staging; seed: "Fixed request-state pools") and for the step's logits when they
 * stay on the device: an executor whose session runs on a device provides them; NULL means host
 * memory (the core allocates and copies it itself). Every pointer is a device address unless said
 * otherwise; the pointer arrays themselves are host memory valid only during the call. Calls run on
 * the engine owner thread. Copies may be asynchronous until `synchronize`; `read` and `sample` are
 * complete when they return. A nonzero return (with a reason) makes the engine unhealthy, except
 * OgaExtExecutionStatus_Interrupted (4): the operation was interrupted (see that status) and the
 * device is intact; inside OgaEngineRun the step is rolled back as Retryable and Run returns without
 * delivering events, elsewhere (engine creation) the call fails. */
typedef struct OgaExtDeviceOps {
  void* context;
  /* `bytes` of device memory (aligned to at least 64 bytes), or NULL when out of memory. */
  void* (*allocate)(void* context, size_t bytes);
  void (*release)(void* context, void* memory);
  /* `count` copies of `bytes` each: sources[i] -> destinations[i] (never overlapping). Returns 0, or
   * nonzero with a NUL-terminated reason in `message`. */
  int32_t (*copy)(void* context, size_t count, const void* const* sources, void* const* destinations, size_t bytes,
                  char* message, size_t message_capacity);
  /* Sets `bytes` at `memory` to zero. Returns 0, or nonzero with a reason. */
  int32_t (*fill_zero)(void* context, void* memory, size_t bytes, char* message, size_t message_capacity);
  /* Waits for every copy enqueued so far. Returns 0, or nonzero with a reason. */
  int32_t (*synchronize)(void* context, char* message, size_t message_capacity);
  /* `count` copies of `bytes` each from device sources[i] to HOST destinations[i]; complete on
   * return. Required for OgaExtStepOutputs.logits_on_device. Returns 0, or nonzero with a reason. */
  int32_t (*read)(void* context, size_t count, const void* const* sources, void* const* destinations, size_t bytes,
                  char* message, size_t message_capacity);
  /* Batched token selection on device logits (see OgaExtDeviceSampling); complete on return. May be
   * NULL: the engine then reads every row back and selects on the host. Returns 0, or nonzero with
   * a reason (a kernel launch failure: the engine becomes unhealthy with that text). */
  int32_t (*sample)(void* context, const OgaExtDeviceSampling* sampling, char* message, size_t message_capacity);
  /* The device's free and total memory in bytes, for sizing the paged KV cache from
   * engine.dynamic_batching.gpu_utilization_factor (budget: free bytes x 0.9 x the factor, as for host
   * memory). May be NULL: the engine then measures available host memory. Returns 0, or nonzero
   * with a reason (engine creation then fails with it). */
  int32_t (*memory_info)(void* context, size_t* free_bytes, size_t* total_bytes, char* message,
                         size_t message_capacity);
} OgaExtDeviceOps;

typedef struct OgaExtModelExecutor {
  /* Capability: the decoder returns one logits row per packed token (draft verification). */
  int32_t per_token_logits;
  /* Widest block table the executor can take (0 = unlimited); wider requests are unserviceable. */
  size_t max_block_table_columns;
  /* Bytes one KV block occupies over every paged layer (keys and values), for sizing the block
   * pool from engine.dynamic_batching.gpu_utilization_factor. 0 = unknown (num_blocks required). */
  size_t bytes_per_block;
  void* model_data;
  /* Required. Allocates per-engine state (caches) for `geometry` and stores it in *engine_data, which
   * the engine passes to execute, execute_static and close_engine. Returns Ok, or a failure with a
   * reason in `message`: OgaCreateEngine then fails "The model executor could not prepare the
   * engine: <reason>" and close_engine is not called (open_engine cleans up after itself). Called
   * once per engine; one model may have several engines open at once. */
  OgaExtExecutionStatus (*open_engine)(void* model_data, const OgaExtEngineGeometry* geometry, void** engine_data,
                                       char* message, size_t message_capacity);
  /* Required. Runs the decoder once over `inputs` (dynamic batching) and fills `outputs` (zeroed by
   * the engine first). The status classifies a failure (see OgaExtExecutionStatus; a value above
   * Interrupted counts as Fatal), with a reason in `message`. */
  OgaExtExecutionStatus (*execute)(void* engine_data, const OgaExtStepInputs* inputs, OgaExtStepOutputs* outputs,
                                   char* message, size_t message_capacity);
  /* Required. Frees what open_engine allocated; called exactly once per successful open_engine, when
   * the engine is destroyed. */
  void (*close_engine)(void* engine_data);
  /* Called once when the last reference to the model goes away. May be NULL. */
  void (*release_model)(void* model_data);
  /* Runs a static-batching step (models without engine.dynamic_batching); must return one logits
   * row per batch row. NULL: the executor has no static path and such engines are refused. */
  OgaExtExecutionStatus (*execute_static)(void* engine_data, const OgaExtStaticStepInputs* inputs,
                                          OgaExtStepOutputs* outputs, char* message, size_t message_capacity);
  /* Capability: the decoder takes block_table_windowed, i.e. its model.decoder.sliding_window
   * layers keep a ring of blocks (see OgaExtEngineGeometry). */
  int32_t windowed_block_table;
  /* Bytes one ring block occupies over every sliding-window ring layer, so automatic sizing leaves
   * room for the ring pool. 0 = unknown or no ring. */
  size_t bytes_per_window_block;
  /* Fixed decoder state (hybrid models): the bytes of one request's row of each fixed state tensor,
   * in model.decoder.state_groups order (each fixed_conv / fixed_recurrent group, its layer_ids in
   * order); the array must stay valid as long as model_data. The count must equal the number of
   * fixed bindings the configuration declares. 0 / NULL = no fixed state. */
  size_t num_fixed_states;
  const size_t* fixed_state_row_bytes;
  /* Capability: every step also writes each packed token's fixed state (see
   * OgaExtStepInputs.fixed_state_captures), which lets a hybrid model verify drafts. */
  int32_t fixed_state_capture;
  /* Capability: the executor captures and replays a CUDA graph per OgaExtStepInputs.graph_id (so it
   * needs every graph step's inputs at bucketed shapes in buffers whose addresses never change). */
  int32_t cuda_graph;
  /* Where the fixed-state pool lives (see OgaExtDeviceOps); NULL = host memory. The table must stay
   * valid as long as model_data. */
  const OgaExtDeviceOps* device_ops;
} OgaExtModelExecutor;

/* Creates a model from a genai_config.json document (text, not a path) and an executor into *out;
 * release with OgaDestroyModel. The table is copied (the arrays and device_ops it points to must
 * stay valid as long as model_data); model_data belongs to the model from this call on, and on any
 * failure it is released (release_model) before the call returns. A table without open_engine,
 * execute or close_engine fails "executor must provide open_engine, execute and close_engine.";
 * configuration errors read as for OgaCreateModel without the file name ("JSON Error: ... at line
 * <l> index <i>" and whole-configuration checks). The model has no directory, so stop strings
 * and guidance need OgaExtModelSetTokenTable. Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtCreateModelWithExecutor(const char* config_json, const OgaExtModelExecutor* executor,
                                                                  OgaModel** out);

/* ---------------------------------------------------------------------------------------------
 * Model loading
 *
 * OgaCreateModel / OgaCreateModelFromConfig parse and validate genai_config.json in the core, then
 * hand the decoder's resolved graph names to the registered model loader, which opens the ONNX
 * session, checks those names against it (dtype, rank, geometry; errors name the file, the tensor
 * and what was expected) and returns the executor. The Python package registers its ONNX Runtime
 * loader when it is imported; without a loader, loading a model directory fails.
 * ------------------------------------------------------------------------------------------- */
/* The kind of a model.decoder.state_groups entry. */
typedef uint32_t OgaExtStateGroupKind;
#define OgaExtStateGroupKind_PagedKv 0u
#define OgaExtStateGroupKind_FixedConv 1u
#define OgaExtStateGroupKind_FixedRecurrent 2u

/* One fixed decoder state binding: the graph input holding each row's committed state and the
 * graph output the step writes the next state to. */
typedef struct OgaExtFixedStateNames {
  OgaExtStateGroupKind kind;  /* FixedConv or FixedRecurrent */
  int32_t layer_id;           /* logical layer id */
  const char* input;
  const char* output;
} OgaExtFixedStateNames;

typedef struct OgaExtDecoderNames {
  const char* model_directory;   /* directory of genai_config.json (UTF-8) */
  const char* config_json;       /* the effective configuration, overlays applied, as JSON text */
  const char* decoder_filename;  /* model.decoder.filename, relative to model_directory */
  /* Graph input names (0.18 defaults where the config names none). Optional inputs are looked up
   * and bound only if the graph declares them. */
  const char* input_ids;
  const char* position_ids;
  const char* cumulative_sequence_lengths;
  const char* past_sequence_lengths;
  const char* block_table;
  const char* block_table_windowed;
  const char* attention_metadata;
  const char* attention_mask;  /* static decoders */
  const char* logits_indices; /* "" when the config names none */
  const char* logits;         /* output */
  /* The paged_kv group: logical layer ids and their expanded cache names, in layer order. */
  size_t num_paged_layers;
  const int32_t* paged_layer_ids;
  const char* const* past_key_names;
  const char* const* past_value_names;
  const char* const* present_key_names;
  const char* const* present_value_names;
  size_t block_size;  /* engine.dynamic_batching.block_size; 0 without dynamic batching (static) */
  size_t vocab_size;
  /* Fixed decoder state (hybrid models): one entry per binding of the fixed_conv / fixed_recurrent
   * groups of model.decoder.state_groups, in manifest order and each group's layer_ids in order
   * (the order of OgaExtModelExecutor.fixed_state_row_bytes), names expanded from
   * model.decoder.inputs past_conv_names / past_recurrent_names and outputs present_conv_names /
   * present_recurrent_names (0.18's defaults where the config names none). 0 / NULL: none. */
  size_t num_fixed_states;
  const OgaExtFixedStateNames* fixed_states;
  /* model.decoder.sliding_window.layers (the layers a graph taking block_table_windowed keeps in a
   * ring of blocks); 0 / NULL without a sliding window. */
  size_t num_sliding_window_layers;
  const int32_t* sliding_window_layers;
  /* model.decoder sizes the executor checks the graph against; 0 where the config has none. */
  size_t num_key_value_heads;
  size_t head_size;
  size_t num_hidden_layers;
  /* engine.dynamic_batching.num_blocks; 0 when the engine sizes the pool itself. */
  size_t num_blocks;
  /* model.decoder.session_options as compact JSON text ("{}" when absent). */
  const char* session_options_json;
} OgaExtDecoderNames;

/* The decoder names a model directory's configuration resolves to: what the model loader receives
 * when the model is created from `config` now. *out points into the config and stays valid until
 * the config's next successful edit or its destruction. Fails with the text model creation would
 * fail with for a configuration whose decoder state cannot be loaded. Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtConfigGetDecoderNames(const OgaConfig* config, const OgaExtDecoderNames** out);

/* Fills *executor (its model_data then belongs to the model). Runs on the thread that loads the
 * model, without the GIL. Returns Ok, or Fatal (or Interrupted) with a NUL-terminated reason in
 * `message`; the model is then not created. */
typedef OgaExtExecutionStatus (*OgaExtModelLoader)(const OgaExtDecoderNames* names, OgaExtModelExecutor* executor,
                                                   char* message, size_t message_capacity);
/* Registers the loader that OgaCreateModel / OgaCreateModelFromConfig use, for the whole process
 * (NULL unregisters: loading then fails). Any thread; a model being loaded keeps the loader it
 * started with. The Python package registers its own when `oga` is imported. */
OGA_EXPORT void OGA_API_CALL OgaExtSetModelLoader(OgaExtModelLoader loader);

/* The configuration's effective genai_config.json (overlays and provider edits applied) as compact
 * JSON text, the same text a loader receives as OgaExtDecoderNames.config_json. *out is owned by
 * the config and valid until its next successful edit or its destruction. Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtConfigGetJson(const OgaConfig* config, const char** out);

/* ---------------------------------------------------------------------------------------------
 * Token text, for stop strings and guidance
 *
 * The engine never tokenizes, but it decodes: stop strings are matched on the text of a turn's
 * generated tokens, and guidance grammars are compiled against every token's bytes. A model's token
 * table is loaded once, at the first turn that needs it, by the registered token-table loader (the
 * Python package registers one that reads the model directory's tokenizer.json with the
 * `tokenizers` package), or set directly with OgaExtModelSetTokenTable (models without a
 * directory, such as the test model).
 * ------------------------------------------------------------------------------------------- */
typedef struct OgaExtTokenTable {
  size_t count;           /* token ids 0 .. count-1 (ids beyond it have no text) */
  const uint8_t* bytes;   /* every token's exact bytes, concatenated (may split UTF-8 characters) */
  const size_t* offsets;  /* [count + 1]: token i is bytes[offsets[i], offsets[i + 1]); offsets[0] == 0 */
  const uint8_t* special; /* [count]: nonzero = special (control) token, no text; NULL = none special */
} OgaExtTokenTable;

/* Fills *table for the model in `model_directory`; its arrays must stay valid until the loader is
 * called again or unregistered (the engine copies them before returning). Runs on an engine owner
 * thread without the GIL. Returns Ok, or Fatal (or Interrupted) with a NUL-terminated reason in
 * `message`; the turn that needed the table then fails without effect, and the next one loads again. */
typedef OgaExtExecutionStatus (*OgaExtTokenTableLoader)(const char* model_directory, OgaExtTokenTable* table,
                                                        char* message, size_t message_capacity);
/* Registers the token-table loader for the whole process (NULL unregisters: a model whose table is
 * not loaded yet then cannot run stop strings or guidance). Any thread; tables already loaded stay. */
OGA_EXPORT void OGA_API_CALL OgaExtSetTokenTableLoader(OgaExtTokenTableLoader loader);
/* Sets (copies) the model's token table, replacing a loaded one for turns that begin afterwards
 * (running turns keep theirs). The table is checked: offsets present when count > 0, offsets[0] == 0,
 * never decreasing, bytes present when offsets[count] > 0, count <= INT32_MAX; each violation has
 * its own message and leaves the model's table unchanged. Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtModelSetTokenTable(OgaModel* model, const OgaExtTokenTable* table);

/* Tokenizes `count` bytes of UTF-8 text with the tokenizer of the model in `model_directory`
 * (no special tokens added), writing at most `capacity` ids to `tokens`; returns how many ids the
 * text has (which may exceed `capacity`), 0 on failure. Guidance calls it where a grammar forces
 * text, so that only the first token of the text's own tokenization is allowed, as with the
 * model's tokenizer in 0.18. Returns OgaExtTokenize_Interrupted when the calling thread was
 * interrupted (see OgaExtExecutionStatus_Interrupted): guidance then falls back to the longest match
 * for this text, and the operation that needed it fails without effect (OgaRequestBeginTurn fails;
 * inside OgaEngineRun the step is rolled back as Retryable and Run returns without delivering
 * events). Any thread (without the GIL). */
#define OgaExtTokenize_Interrupted ((size_t)-1)
typedef size_t (*OgaExtTokenizeFunction)(const char* model_directory, const uint8_t* bytes, size_t count,
                                         uint32_t* tokens, size_t capacity);
/* Registers the tokenizer for the whole process (NULL unregisters). Without one, and for models
 * without a directory, guidance uses llguidance's own approximation, which forces no token; where
 * the tokenizer fails or disagrees with the token table, the longest match over the table. Any
 * thread; a model takes the function registered when its first guided turn begins (again after
 * OgaExtModelSetTokenTable) and keeps it. */
OGA_EXPORT void OGA_API_CALL OgaExtSetTokenizeFunction(OgaExtTokenizeFunction tokenize);

/* Guidance runs llguidance through its C API, loaded at the first guided turn from this shared
 * library (the Python package sets the llguidance wheel's extension module when llguidance is
 * installed; environment variable OGA_LLGUIDANCE_LIBRARY overrides). NULL clears. Only the path is
 * stored here (fails only when memory runs out); loading errors -- a missing or foreign library, an
 * llguidance that is not 1.x -- fail the BeginTurn that needs it. Any thread; once loaded, the library
 * stays loaded for the process and later paths are ignored. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtSetGuidanceLibrary(const char* path);

/* ---------------------------------------------------------------------------------------------
 * Built-in deterministic test model
 *
 * The test executor keeps a paged token store [num_blocks * block_size] slots. Each slot holds
 * (token, position, state), where state = Mix(state of the previous position read back through
 * the block table, token, position) and the state of position -1 is the constant 0x6f6761. The
 * logits of a token are a pure function of its state, so any block-table, packing or commit bug
 * changes tokens; a slot that does not hold the position the table claims is reported as a fatal
 * execution failure. The exact formulas are in src/testing/test_executor.cpp.
 *
 * config_json is a genai_config.json document plus an optional "test_model" object:
 *   {"per_token_logits": bool (default false), "max_block_table_columns": int (default 0),
 *    "windowed_block_table": bool (the executor keeps and checks a sliding-window ring),
 *    "fixed_state_row_words": int >= 2 (default 2), "fixed_state_capture": bool (default false),
 *    "cuda_graph": bool (declares CUDA graphs and checks graph steps),
 *    "device_ops": bool (the engine's fixed-state memory comes from a simulated device: separate
 *    allocations, batched copies that fault phase DeviceCopy can fail, synchronization counted),
 *    "device_logits": bool (with device_ops: every step's logits live in simulated device memory,
 *    reported with OgaExtStepOutputs.logits_on_device; `read` copies rows back and `sample` selects
 *    with the host sampler's code, the device sampler's reference; fault phase DeviceSample fails it),
 *    "device_sampling": bool (default true; false leaves OgaExtDeviceOps.sample NULL)}
 * With fixed_conv / fixed_recurrent groups in model.decoder.state_groups the test model is a hybrid
 * decoder: one fixed state tensor per fixed binding, rows of fixed_state_row_words 8-byte words,
 * each row's input checked against the row's token history (see src/testing/test_executor.cpp).
 * ------------------------------------------------------------------------------------------- */
/* Creates the test model of `config_json` (text) into *out; release with OgaDestroyModel. Needs no
 * loader and no files; configuration errors as for OgaExtCreateModelWithExecutor. Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtCreateTestModel(const char* config_json, OgaModel** out);

/* Fault injection for transaction tests. Phases: where the engine consults the injector. */
typedef uint32_t OgaExtFaultPhase;
#define OgaExtFaultPhase_Plan 0u          /* planning: kind Fatal is a planning consistency failure
                                            (contract failure, also with no executable turn); any
                                            other kind is an allocation failure that escapes Run
                                            and leaves the engine healthy */
#define OgaExtFaultPhase_Reserve 1u       /* cache reservation after an executable plan: contract failure */
#define OgaExtFaultPhase_Execute 2u       /* the executor reports `kind` */
#define OgaExtFaultPhase_Sample 3u        /* post-processing failure after the rows' tokens were selected
                                            (and drawn): retryable batch abort */
#define OgaExtFaultPhase_CommitPrepare 4u /* commit preparation: contract failure after rollback */
#define OgaExtFaultPhase_Commit 5u        /* publication: execution failure, fail-stop */
#define OgaExtFaultPhase_FixedStatePrepare 6u /* hybrid models: the fixed-state pool's commit preparation
                                                fails after writing half of the step's rows into the
                                                inactive banks: fatal (the active banks are untouched) */
#define OgaExtFaultPhase_DeviceCopy 7u /* the test model's simulated device ("device_ops": true) fails a
                                         copy: during reservation (fixed-state gather) a contract
                                         failure, during commit preparation an execution failure */
#define OgaExtFaultPhase_DeviceSample 8u /* the simulated device's `sample` ("device_logits": true)
                                           fails: the step is rolled back and the engine unhealthy */
/* `kind`: for OgaExtFaultPhase_Execute, the OgaExtExecutionStatus the executor reports; for
 * OgaExtFaultPhase_Plan, Fatal or not (see above); for OgaExtFaultPhase_DeviceCopy, _DeviceSample
 * and _FixedStatePrepare, Interrupted makes the operation report an interruption (see
 * OgaExtExecutionStatus_Interrupted: the step is rolled back as Retryable, the engine stays
 * healthy) and any other kind the failure described above; ignored by the other phases. */
/* Arms the fault: the next `skip` consultations of `phase` pass, then `count` fail (count 0
 * disarms; kind Ok fires as Retryable). Arming again replaces the phase's previous arming; engines
 * of the model share it. Fails "Fault injection requires a test model.", "Unknown fault phase
 * <n>." or "Unknown fault kind <n>.". Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtTestModelInjectFault(OgaModel* model, OgaExtFaultPhase phase, OgaExtExecutionStatus kind,
                                                               uint64_t skip, uint64_t count);

/* [owner] Puts the events the last OgaEngineRun delivered into `buffer` back at the front of the
 * engine's retained events, in order, and empties the buffer (its views become stale): the next Run
 * (on any buffer of the engine) delivers them again, and OgaEngineHasPendingRequests counts them. For
 * a binding that cannot hand a completed Run's events to its caller: the Python binding calls it
 * when a KeyboardInterrupt arrives while Run runs without the GIL, so the interrupted loop loses no
 * event. A buffer of another engine fails "buffer must be used with the Engine that created it.";
 * from an executor callback it fails "Cannot requeue events while a step is in flight.". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtEngineRequeueEvents(OgaEngine* engine, OgaEngineEventBuffer* buffer);

/* ---------------------------------------------------------------------------------------------
 * Seed-era request creation: engine.create_request(params, options).
 * ------------------------------------------------------------------------------------------- */
/* [owner] Like OgaEngineCreateRequest, with request-level search defaults copied from `params`
 * instead of the model (max_length gives the default session cap; num_beams, min_length and
 * max_length are checked as there; the sampling settings and random_seed give every turn's
 * defaults). `params` NULL fails "params must not be null."; parameters created from another model
 * fail "The GeneratorParams were created for another model than the engine's." (their vocabulary
 * bounds and EOS ids are that model's). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtEngineCreateRequestWithParams(OgaEngine* engine, const OgaGeneratorParams* params,
                                                                        const OgaRequestOptions* request_options, OgaRequest** out);

/* Sets `count` search options at once, all or none: names[i] with numbers[i], through
 * OgaGeneratorParamsSetSearchBool (numbers[i] != 0) where is_bool[i] is nonzero, else through
 * OgaGeneratorParamsSetSearchNumber, each validated as there; the first failure is returned with that
 * setter's text and `params` is left as before the call (the Python set_search_options(**options)).
 * Any thread, not concurrently with another call on `params`. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtGeneratorParamsSetSearchOptions(OgaGeneratorParams* params, size_t count,
                                                                         const char* const* names,
                                                                         const double* numbers,
                                                                         const int32_t* is_bool);

/* OgaGenerator_IsDone with an error channel (the Python binding's is_done): fails with "Session in
 * Terminated state, exiting!" while terminate_session is set, as 0.18's Python is_done raises. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtGeneratorIsDone(OgaGenerator* generator, bool* out);

/* ---------------------------------------------------------------------------------------------
 * Binding support
 * ------------------------------------------------------------------------------------------- */
/* One opaque pointer per request handle for the language binding (Python stores its Request
 * object, borrowed): the library never dereferences or frees it, and it goes with the handle
 * (OgaDestroyRequest). Any thread (atomic). NULL request -> no-op / NULL; NULL until set. */
OGA_EXPORT void OGA_API_CALL OgaExtRequestSetUserData(OgaRequest* request, void* user_data);
OGA_EXPORT void* OGA_API_CALL OgaExtRequestGetUserData(const OgaRequest* request);
/* Counts the positive-capacity runs of the buffer that passed validation (each one invalidates the
 * buffer's views): a view taken at generation G is stale once this differs from G. NULL -> 0. Any
 * thread (not concurrently with Run). */
OGA_EXPORT uint64_t OGA_API_CALL OgaExtEngineEventBufferGetGeneration(const OgaEngineEventBuffer* buffer);
/* Slots the buffer was created with. NULL -> 0. Any thread. */
OGA_EXPORT size_t OGA_API_CALL OgaExtEngineEventBufferGetCapacity(const OgaEngineEventBuffer* buffer);
/* The engine's random function, Philox4x32-10 (src/base/random_stream.h): the four output words for
 * counter (low 32 bits, high 32 bits, 0, 0) and key (low 32 bits, high 32 bits). A request's draw n
 * under seed s is Philox4x32_10(n, s); device samplers must reproduce it. NULL `out` -> no-op. Any
 * thread. */
OGA_EXPORT void OGA_API_CALL OgaExtPhilox4x32_10(uint64_t counter, uint64_t key, uint32_t out[4]);
/* Path of the shared library that exports this API (for ctypes), in static storage valid for the
 * life of the process; "" when the system cannot tell. Any thread. */
OGA_EXPORT const char* OGA_API_CALL OgaExtLibraryPath(void);

/* ---------------------------------------------------------------------------------------------
 * Introspection for tests and benchmarks. [owner]
 * ------------------------------------------------------------------------------------------- */
/* Checks every engine invariant (block ownership and accounting, request/cache progress,
 * scheduler membership; seed: "Paged KV-cache ownership"). Fails "Engine invariants violated:"
 * followed by one line per violation. Changes nothing. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtEngineCheckInvariants(const OgaEngine* engine);

typedef struct OgaExtEngineCounters {
  uint64_t model_runs;          /* executor calls */
  uint64_t committed_steps;
  uint64_t rolled_back_steps;
  uint64_t step_ns;             /* wall time inside transactions (and static steps), cumulative */
  uint64_t executor_ns;         /* part of step_ns spent inside the executor */
  uint64_t total_blocks;
  uint64_t free_blocks;
  uint64_t resident_requests;
  uint64_t waiting_requests;
  uint64_t bound_requests;      /* requests the engine holds (not closed, not reclaimed) */
  uint64_t retained_events;
  /* Hybrid models: committed steps whose fixed state was bound directly as bank views, and those
   * that gathered / staged it. */
  uint64_t fixed_state_direct_steps;
  uint64_t fixed_state_fallback_steps;
  /* Device logits (OgaExtStepOutputs.logits_on_device): rows selected by OgaExtDeviceOps.sample, and
   * logits rows read back to the host for host selection. */
  uint64_t device_sampled_rows;
  uint64_t host_read_logits_rows;
  /* Recompute preemption (engine.dynamic_batching.preemption "recompute"): residents whose KV cache a
   * step released because nothing else fitted, and tokens prefilled again for them afterwards
   * (tokens their released cache had held; adopted prefix-cache blocks are not counted). */
  uint64_t preemptions;
  uint64_t recomputed_tokens;
} OgaExtEngineCounters;
/* Copies the engine's counters into *out (caller storage). Cumulative counters count from engine
 * creation; block and request counts are the current ones. On a static engine only model_runs,
 * committed_steps, step_ns, executor_ns, bound_requests and retained_events move; the rest stay 0. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtEngineGetCounters(const OgaEngine* engine, OgaExtEngineCounters* out);

/* The packed inputs of the last executed dynamic step, copied into *out: its pointers are views into
 * engine buffers, valid until the next Run or the engine's destruction. num_rows == 0 before the
 * first step and always on static engines. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtEngineGetLastStepInputs(const OgaEngine* engine, OgaExtStepInputs* out);

/* A request's committed fixed-state slot (hybrid models). slot -1 = the request owns none. */
typedef struct OgaExtFixedStateSlot {
  int32_t slot;
  uint32_t active_bank;            /* 0 or 1: the bank holding the visible committed state */
  uint64_t allocation_generation;  /* advanced each time the slot is given to a new owner */
  uint64_t state_generation;       /* advanced by every commit that publishes the slot's state */
  uint64_t committed_tokens;       /* tokens baked into the committed state */
} OgaExtFixedStateSlot;
/* Copies the request's slot into *out; slot -1 (the rest zero) when the request owns none, which
 * is also the answer for a closed request (then on any thread). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtRequestGetFixedStateSlot(const OgaRequest* request, OgaExtFixedStateSlot* out);
/* The committed state row of fixed tensor `tensor` of `request`: *data points into the pool's active
 * bank (valid until the next Run), *size its bytes. Host-memory pools only (an executor without
 * OgaExtDeviceOps); a device pool is refused. Also fails for a closed request ("Cannot use a closed
 * request."), a model without fixed state, `tensor` >= the number of fixed tensors, and a request
 * that owns no committed state yet. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtRequestGetFixedStateRow(const OgaRequest* request, size_t tensor,
                                                                  const void** data, size_t* size);
/* Benchmarks and tests: nonzero = always gather / stage fixed state, never bind bank views directly;
 * 0 = bind them when the rows allow (the default). Applies from the next step. Fails "This engine's
 * model has no fixed decoder state." for other models. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtEngineSetFixedStateFallbackOnly(OgaEngine* engine, int32_t fallback_only);

/* Test hook: sets the request's last assigned turn id, so turn-id exhaustion can be exercised
 * (the next BeginTurn assigns turn_id + 1, or fails at UINT64_MAX). Only for an Unassigned or
 * TurnComplete request without pending events ("The last turn id can only be set on an idle
 * request without pending events."); closed requests fail "Cannot use a closed request.". Rewind
 * targets are not adjusted. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaExtRequestSetLastTurnIdForTesting(OgaRequest* request, uint64_t turn_id);

#ifdef __cplusplus
}
#endif

#endif /* OGA_OGA_EXT_H_ */
