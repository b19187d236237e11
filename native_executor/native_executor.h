/*
 * native_executor.h -- oga's native ONNX Runtime executor: an OgaExtModelExecutor (oga_ext.h)
 * implemented in C++ over ONNX Runtime's C API, so that a step never enters Python (the Python
 * executor, oga/executor/host.py, takes and hands back the GIL several times per step).
 *
 * This library is built as the extension module oga._native_executor, loaded by
 * oga/executor/native.py with ctypes, and never linked into the core: the core only sees the
 * callback table it fills. ONNX Runtime itself is loaded at run time (dlopen of the onnxruntime
 * wheel's libonnxruntime.so), never linked.
 *
 * Scope: every decoder kind that runs on the CPU execution provider -- paged decoders (the
 * standard-op and fused graphs, logits indices, per-token logits, float16 caches, quantized
 * weights), their sliding-window ring layers, fixed decoder state (hybrid models, per-token
 * capture included) -- and static-batching decoders (contiguous GroupQueryAttention caches, OGA's
 * own CPU builds). Decoders on a device (the CUDA execution provider) stay on the Python executor.
 *
 * Loading takes two calls, so that the decoder is validated against the very session that will
 * run it: OgaNativeSessionOpen creates the session, oga/executor/decoder.py validates the graph from
 * OgaNativeSessionDescribe (the checks and messages of the Python executor), and
 * OgaNativeExecutorLoad hands the resolved names and geometry over and fills the executor table,
 * which then owns the session.
 *
 * Threads: every exported function may be called from any thread (the runtime is opened once per
 * process, under a lock; a session is used by one caller at a time). The callbacks the table holds
 * run where oga_ext.h says (the engine owner thread) and never touch Python.
 *
 * Errors: functions returning int32_t return 0 on success, else nonzero with a NUL-terminated
 * reason in `message` (at most `message_capacity` bytes, truncated).
 */
#ifndef OGA_NATIVE_EXECUTOR_NATIVE_EXECUTOR_H_
#define OGA_NATIVE_EXECUTOR_NATIVE_EXECUTOR_H_

#include <stddef.h>
#include <stdint.h>

#include "oga/oga_ext.h"

#define OGA_NATIVE_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* How to create a decoder's session (model.decoder.session_options). Strings are UTF-8 and only
 * need to live for the call. */
typedef struct OgaNativeSessionSpec {
  const char* model_path;         /* the decoder's .onnx file */
  const char* ortops_library;     /* oga's operator library, registered on the session; NULL = none */
  const char* log_id;             /* model.decoder.session_options.log_id; NULL = none */
  int32_t intra_op_num_threads;   /* -1 = ONNX Runtime's default */
  int32_t inter_op_num_threads;   /* -1 = ONNX Runtime's default */
} OgaNativeSessionSpec;

/* One fixed decoder state tensor (hybrid models, oga_ext.h OgaExtStepInputs): per request row,
 * row_rank dimensions row_dims of element_type, row_bytes bytes. */
typedef struct OgaNativeFixedState {
  const char* input;    /* graph input: the committed state of each row */
  const char* output;   /* graph output: the state after the row's last packed token */
  const char* capture;  /* graph output [num_tokens, row...]: the state after every packed token; NULL = none */
  int32_t element_type; /* ONNX element type: 1 float, 10 float16, 6 int32, 7 int64 */
  size_t row_rank;      /* 1 .. OGA_NATIVE_MAX_ROW_RANK */
  const int64_t* row_dims;
  size_t row_bytes;
} OgaNativeFixedState;

#define OGA_NATIVE_MAX_ROW_RANK 7

/* A cache tensor as the graph declares it, checked at open_engine against what the engine
 * allocates (the Python executor's messages). dims: -1 where symbolic. */
typedef struct OgaNativeCacheTensor {
  const char* name;
  int64_t dims[4];
  int32_t ring;   /* 1: a sliding-window ring layer's cache (dimension 0 = the window blocks) */
} OgaNativeCacheTensor;

/* The decoder to run, validated by the Python side (oga/executor/decoder.py OnnxDecoder). Every
 * string is UTF-8; the library copies what it keeps, so the spec only needs to live for the call.
 * Optional graph inputs are NULL when the graph does not declare them. */
typedef struct OgaNativeDecoderSpec {
  /* 1: a static-batching decoder (contiguous caches [rows, kv_heads, max_length, head_size], run
   * by execute_static); 0: a paged decoder (run by execute). */
  int32_t static_batching;
  const char* input_ids;
  const char* position_ids;       /* NULL: not a graph input */
  const char* cumulative_sequence_lengths;  /* paged */
  const char* past_sequence_lengths;        /* paged */
  const char* block_table;                  /* paged */
  const char* block_table_windowed;         /* paged; NULL: no sliding-window ring */
  const char* attention_metadata; /* paged; NULL: not a graph input */
  const char* logits_indices;     /* paged; NULL: not a graph input */
  const char* attention_mask;     /* static */
  const char* logits;             /* output: [rows, vocab] (paged) or [rows, query, vocab] (static) */
  /* The cache layers, in layer order: each cache is bound as both past (input) and present
   * (output). Paged: [num_blocks (a ring layer: window blocks), block_size, kv_heads, head_size];
   * static: [rows, kv_heads, max_length, head_size]. */
  size_t num_layers;
  const int32_t* layer_ids;       /* [num_layers] logical layer ids (for messages) */
  const char* const* past_key_names;
  const char* const* past_value_names;
  const char* const* present_key_names;
  const char* const* present_value_names;
  const int32_t* ring_layers;     /* [num_layers] 1 = a sliding-window ring layer; NULL = none */
  int32_t cache_element_type;     /* ONNX element type: 1 float, 10 float16 */
  size_t block_size;              /* paged */
  size_t kv_heads;
  size_t head_size;
  size_t num_cache_tensors;
  const OgaNativeCacheTensor* cache_tensors;
  size_t configured_num_blocks;   /* engine.dynamic_batching.num_blocks (0 = sized automatically) */
  int32_t logits_element_type;    /* 1 float, 10 float16 */
  size_t vocab_size;
  int32_t per_token_logits;       /* 1: one logits row per packed token, else one per row */
  size_t num_fixed_states;        /* in model.decoder.state_groups order; 0 = none */
  const OgaNativeFixedState* fixed_states;
  /* paged, float logits: output [rows, ceil(vocab / 1024)] float, the logits' block maxima
   * (OgaExtStepOutputs.logits_block_maxima); NULL: the graph has none */
  const char* logits_block_maxima;
  /* static: 1 = a new batch's prefill whose rows differ in length runs every row alone, over its
   * own tokens (fixed state or sliding-window layers: the padding must not reach them) */
  int32_t static_rows_alone;
} OgaNativeDecoderSpec;

/* sizeof of the spec structs, so the ctypes mirrors can check their layout. */
OGA_NATIVE_EXPORT size_t OgaNativeDecoderSpecSize(void);
OGA_NATIVE_EXPORT size_t OgaNativeFixedStateSize(void);
OGA_NATIVE_EXPORT size_t OgaNativeCacheTensorSize(void);

/* The ONNX Runtime C API version the executor asks for. */
OGA_NATIVE_EXPORT uint32_t OgaNativeExecutorApiVersion(void);

/* Opens ONNX Runtime from `library_path` (a libonnxruntime.so exporting OrtGetApiBase) and asks
 * for C API version `api_version` (OgaNativeExecutorApiVersion(), or another for tests). The
 * first success is kept for the process; later calls with the same path and a version it provides
 * succeed at once. A runtime that lacks the version is refused naming both versions; nothing is
 * kept then. */
OGA_NATIVE_EXPORT int32_t OgaNativeRuntimeOpen(const char* library_path, uint32_t api_version, char* message,
                                               size_t message_capacity);

/* The opened runtime's version string ("1.32.0"), or "" before a successful OgaNativeRuntimeOpen. */
OGA_NATIVE_EXPORT const char* OgaNativeRuntimeVersion(void);

/* Calls every declared OrtApi entry whose effect is observable without a model and checks the
 * effect (see ort_session_api.h). Needs an opened runtime. */
OGA_NATIVE_EXPORT int32_t OgaNativeExecutorCheckApi(char* message, size_t message_capacity);

/* Creates a session on the CPU execution provider (needs an opened runtime). On success *session
 * is a new session owned by the caller until OgaNativeExecutorLoad takes it or
 * OgaNativeSessionRelease frees it. On failure *session is untouched and `message` holds ONNX
 * Runtime's text as the onnxruntime Python binding's exception shows it
 * ("[ONNXRuntimeError] : 1 : FAIL : ..."). */
OGA_NATIVE_EXPORT int32_t OgaNativeSessionOpen(const OgaNativeSessionSpec* spec, void** session, char* message,
                                               size_t message_capacity);

/* Frees a session the caller still owns. NULL is ignored. */
OGA_NATIVE_EXPORT void OgaNativeSessionRelease(void* session);

/* The session's graph inputs and outputs as a JSON array, inputs first, each
 * {"kind": "input"|"output", "name": ..., "type": <ONNX element type, 0 for a non-tensor>,
 *  "dims": [<int> | "<symbolic name>" | null, ...]} (an int for a fixed dimension, the dimension's
 * name for a named symbolic one, null for an unnamed one: what onnxruntime's NodeArg.shape holds).
 * Writes at most `capacity` bytes (NUL-terminated) and returns the bytes the whole text needs
 * (its length + 1), or 0 on failure (the reason in `text`). `session` may be one the caller owns
 * or the model_data of a loaded executor. */
OGA_NATIVE_EXPORT size_t OgaNativeSessionDescribe(void* session, char* text, size_t capacity);

/* Takes `session` (from OgaNativeSessionOpen) and fills the executor table's model_data,
 * open_engine, execute, execute_static, close_engine, release_model and fixed_state_row_bytes
 * (an array the model keeps); every other member is left as the caller set it. On success the
 * table owns the session (release_model frees it); on failure nothing in `executor` is written and
 * the caller still owns the session. */
OGA_NATIVE_EXPORT int32_t OgaNativeExecutorLoad(void* session, const OgaNativeDecoderSpec* spec,
                                                OgaExtModelExecutor* executor, char* message,
                                                size_t message_capacity);

/* Test and benchmark support, for model_data from OgaNativeExecutorLoad while the model lives:
 * nanoseconds its engines spent inside RunWithBinding, and how many inputs and outputs they bound
 * (an input whose buffer address and shape did not change since the engine's previous step is not
 * bound again). */
OGA_NATIVE_EXPORT uint64_t OgaNativeModelRunNs(const void* model_data);
OGA_NATIVE_EXPORT uint64_t OgaNativeModelBindCount(const void* model_data);

#ifdef __cplusplus
}
#endif

#endif /* OGA_NATIVE_EXECUTOR_NATIVE_EXECUTOR_H_ */
