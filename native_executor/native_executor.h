/*
 * native_executor.h -- oga's native ONNX Runtime executor: an OgaExtModelExecutor (oga_ext.h)
 * implemented in C++ over ONNX Runtime's C API, so that a step never enters Python (the Python
 * executor, oga/onnx_executor.py, takes and hands back the GIL several times per step).
 *
 * This library is built as the extension module oga._native_executor, loaded by
 * oga/native_executor.py with ctypes, and never linked into the core: the core only sees the
 * callback table it fills. ONNX Runtime itself is loaded at run time (dlopen of the onnxruntime
 * wheel's libonnxruntime.so), never linked.
 *
 * Scope of this version: paged decoders on the CPU execution provider without fixed state and
 * without a sliding-window ring (the standard-op and the fused graphs oga.models.build emits for
 * CPU). The Python side validates the decoder exactly as for its own executor (OnnxDecoder) and
 * hands over the resolved names and geometry as an OgaNativeDecoderSpec; every other decoder kind
 * stays on the Python executor.
 *
 * Threads: OgaNativeRuntimeOpen, OgaNativeExecutorCheckApi, OgaNativeExecutorLoad and
 * OgaNativeExecutorDescribe may be called from any thread (the runtime is opened once per process,
 * under a lock). The callbacks the table holds run where oga_ext.h says (the engine owner thread)
 * and never touch Python.
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

/* The decoder to run, validated by the Python side (oga/onnx_executor.py OnnxDecoder). Every
 * string is UTF-8; the library copies what it keeps, so the spec only needs to live for the call.
 * Optional graph inputs are NULL when the graph does not declare them. */
typedef struct OgaNativeDecoderSpec {
  const char* model_path;         /* the decoder's .onnx file */
  const char* ortops_library;     /* oga's operator library, registered on the session; NULL = none */
  const char* log_id;             /* model.decoder.session_options.log_id; NULL = none */
  int32_t intra_op_num_threads;   /* -1 = ONNX Runtime's default */
  int32_t inter_op_num_threads;   /* -1 = ONNX Runtime's default */
  const char* input_ids;
  const char* position_ids;       /* NULL: not a graph input */
  const char* cumulative_sequence_lengths;
  const char* past_sequence_lengths;
  const char* block_table;
  const char* attention_metadata; /* NULL: not a graph input */
  const char* logits_indices;     /* NULL: not a graph input */
  const char* logits;             /* output */
  /* The paged layers, in layer order: each cache is bound as both past (input) and present
   * (output), [num_blocks, block_size, kv_heads, head_size] of cache_element_type. */
  size_t num_layers;
  const char* const* past_key_names;
  const char* const* past_value_names;
  const char* const* present_key_names;
  const char* const* present_value_names;
  int32_t cache_element_type;     /* ONNX element type: 1 float, 10 float16 */
  size_t block_size;
  size_t kv_heads;
  size_t head_size;
  /* The graph's dimension 0 of every cache tensor (-1 = symbolic), checked at open_engine against
   * the blocks the engine allocates, with the Python executor's message; configured_num_blocks is
   * engine.dynamic_batching.num_blocks (0 = sized automatically). */
  size_t num_cache_tensors;
  const char* const* cache_tensor_names;
  const int64_t* cache_tensor_blocks;
  size_t configured_num_blocks;
  int32_t logits_element_type;    /* 1 float, 10 float16 */
  size_t vocab_size;
  int32_t per_token_logits;       /* 1: one logits row per packed token, else one per row */
} OgaNativeDecoderSpec;

/* sizeof(OgaNativeDecoderSpec), so the ctypes mirror can check its layout. */
OGA_NATIVE_EXPORT size_t OgaNativeDecoderSpecSize(void);

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

/* Creates the decoder's session and fills the executor table's model_data, open_engine, execute,
 * close_engine and release_model (execute_static NULL: no static path); every other member is left
 * as the caller set it. On failure nothing in `executor` is written. */
OGA_NATIVE_EXPORT int32_t OgaNativeExecutorLoad(const OgaNativeDecoderSpec* spec, OgaExtModelExecutor* executor,
                                                char* message, size_t message_capacity);

/* Test support: a description of the session behind model_data (from OgaNativeExecutorLoad), one
 * line per graph input then output: "input|output <name> <element type> <dim>,<dim>,..." (-1 for a
 * symbolic dimension). Writes at most `capacity` bytes (NUL-terminated) and returns the bytes the
 * whole text needs, or 0 on failure (the reason in `text`). */
OGA_NATIVE_EXPORT size_t OgaNativeExecutorDescribe(void* model_data, char* text, size_t capacity);

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
