/*
 * oga.h -- the C API of oga: the experimental Engine API of ONNX Runtime GenAI 0.18.
 *
 * Names, signatures, constants and error texts follow onnxruntime-genai 0.18 so that code written
 * against its Engine runs unchanged. Additions that 0.18 does not have live in oga_ext.h and carry
 * the OgaExt prefix. The engine's model (requests, turns, drain-or-execute runs, transactions) is the
 * one onnxruntime-genai's design document describes: docs/paged_attention_engine.md in the
 * onnxruntime-genai repository (github.com/microsoft/onnxruntime-genai), not in oga's; this project
 * was built from it. Its sections are cited here and in the core's sources as seed: "<section
 * title>", by title, as the document stands in that repository.
 *
 * Conventions (apply to every function below unless its comment says otherwise):
 * - Functions returning OgaResult* return NULL on success. A non-NULL result is owned by the caller
 *   and released with OgaDestroyResult; its message (OgaResultGetError) lives as long as it does.
 *   A failed call changes nothing: no handle, request, cache or event state is mutated.
 * - Misuse (NULL handles, bad ranges, wrong thread, wrong engine, illegal state) is reported only
 *   through OgaResult. Outcomes of OgaEngineRun (capacity, retryable, failures) are reported only
 *   through events and error codes. Do not parse message texts to classify outcomes; the texts quoted
 *   below are for people reading logs.
 * - NULL arguments: a NULL handle or NULL required pointer fails with "<argument> must not be null."
 *   (for example "engine must not be null."). Functions that return a value instead of an OgaResult
 *   map a NULL handle to 0 / NULL, as noted on each.
 * - `out` arguments after a failure: a function that creates a handle sets *out to NULL before its
 *   checks, so *out is NULL after any failure (except OgaRequestCreateTurnOptions with a NULL
 *   request, as in 0.18, and OgaCreateRequestOptions, OgaCreateStringArray and OgaCreateSequences,
 *   which can fail only for a NULL `out` or lack of memory and then leave it untouched). Other `out`
 *   values are meaningless after a failure unless the function says what it writes.
 * - A handle that is not NULL must be one this library created and the caller has not destroyed;
 *   anything else (a freed or foreign pointer) is undefined behaviour, not an error.
 * - Owner thread: the thread that called OgaCreateEngine. Functions marked [owner] must be called
 *   on it; elsewhere they fail with "Engine operations must be called from the Engine owner thread."
 *   Functions marked "any thread" have no owner check. Calls on one handle are not synchronized
 *   against each other: do not use a handle from two threads at once unless its comment allows it.
 *   [owner] functions must not be called from inside an executor callback (oga_ext.h): the request
 *   operations refuse with "Cannot <operation> while a step is in flight."; the others are not
 *   guarded.
 * - A poisoned engine (after an EngineContractFailure or EngineExecutionFailure event) fails
 *   request creation, BeginTurn and, once its retained events are drained, Run with the stored
 *   failure message.
 * - Every OgaDestroy* function accepts NULL (0.18 crashes on some of them; oga does not).
 * - Inputs (token ids, options, strings) are copied before a call returns; the caller may reuse
 *   its storage immediately.
 * - Borrowed views (OgaEngineEvent*, OgaTurnUsage*, the OgaRequest* an event names) stay valid
 *   until the next successfully validated OgaEngineRun on the same buffer, or the buffer's
 *   destruction, whichever comes first.
 */
#ifndef OGA_OGA_H_
#define OGA_OGA_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef _WIN32
#define OGA_API_CALL __stdcall
#define OGA_EXPORT __declspec(dllexport)
#else
#define OGA_API_CALL
#define OGA_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Opaque handles
 * ------------------------------------------------------------------------------------------- */
typedef struct OgaResult OgaResult;                         /* error object; NULL = success */
typedef struct OgaModel OgaModel;                           /* model config + executor */
typedef struct OgaConfig OgaConfig;                         /* editable genai_config.json of a model directory */
typedef struct OgaGeneratorParams OgaGeneratorParams;       /* seed-era request search defaults */
typedef struct OgaEngine OgaEngine;                         /* continuous-batching engine */
typedef struct OgaRequest OgaRequest;                       /* one conversation (single sequence) */
typedef struct OgaRequestOptions OgaRequestOptions;         /* session policy, reusable */
typedef struct OgaTurnOptions OgaTurnOptions;               /* per-turn policy, bound to a request */
typedef struct OgaEngineEventBuffer OgaEngineEventBuffer;   /* caller-owned event storage */
typedef struct OgaEngineEvent OgaEngineEvent;               /* borrowed view into a buffer */
typedef struct OgaTurnUsage OgaTurnUsage;                   /* borrowed view into an event */
typedef struct OgaEngineCapabilities OgaEngineCapabilities; /* owned immutable snapshot */
typedef struct OgaSpeculativeStats OgaSpeculativeStats;     /* owned immutable snapshot */
typedef struct OgaStringArray OgaStringArray;               /* owned list of NUL-terminated strings */
typedef struct OgaSequences OgaSequences;                   /* owned list of token-id sequences */
typedef struct OgaGenerator OgaGenerator;                   /* token-by-token generation loop */
typedef struct OgaTensor OgaTensor;                         /* n-dimensional array (Generator logits) */
typedef struct OgaNamedTensors OgaNamedTensors;             /* never created by oga (not supported) */

/* ---------------------------------------------------------------------------------------------
 * Constants: fixed-width typedefs with #defined values; never renumbered.
 * ------------------------------------------------------------------------------------------- */
typedef uint32_t OgaFinishReason;
#define OgaFinishReason_None 0u               /* not a terminal event */
#define OgaFinishReason_Eos 1u                /* model produced EOS (never emitted or appended) */
#define OgaFinishReason_StopString 2u         /* a decoded stop string matched */
#define OgaFinishReason_MaxGeneratedTokens 3u /* per-turn max_generated_tokens reached */
#define OgaFinishReason_MaxSessionTokens 4u   /* request-wide max_session_tokens reached */
#define OgaFinishReason_Cancelled 5u          /* OgaRequestCancelTurn */
#define OgaFinishReason_Failed 6u             /* unserviceable request or engine failure */

typedef uint32_t OgaEngineEventFlags; /* bitmask: test bits, never compare for equality */
#define OgaEngineEventFlag_None 0u
#define OgaEngineEventFlag_Token (1u << 0)
#define OgaEngineEventFlag_TurnFinished (1u << 1)
#define OgaEngineEventFlag_CapacityBlocked (1u << 2)
#define OgaEngineEventFlag_Failed (1u << 3)
#define OgaEngineEventFlag_Retryable (1u << 4)

typedef uint32_t OgaErrorCode;
#define OgaErrorCode_None 0u
#define OgaErrorCode_CapacityDeferred 1u          /* CapacityBlocked: nothing fits free capacity now */
#define OgaErrorCode_ExecutionCapacityExceeded 2u /* CapacityBlocked: execution out of memory, rolled back */
#define OgaErrorCode_RetryableExecution 3u        /* Retryable: step rolled back */
#define OgaErrorCode_RequestUnserviceable 4u      /* TurnFinished|Failed: request can never fit */
#define OgaErrorCode_EngineContractFailure 5u     /* broken internal invariant; engine poisoned */
#define OgaErrorCode_EngineExecutionFailure 6u    /* unrecoverable execution failure; engine poisoned */

/* Element types of OgaTensor (ONNX's numbering; 0.18's OgaElementType enum has the same values). */
typedef int32_t OgaElementType;
#define OgaElementType_undefined 0
#define OgaElementType_float32 1
#define OgaElementType_uint8 2
#define OgaElementType_int8 3
#define OgaElementType_uint16 4
#define OgaElementType_int16 5
#define OgaElementType_int32 6
#define OgaElementType_int64 7
#define OgaElementType_string 8
#define OgaElementType_bool 9
#define OgaElementType_float16 10
#define OgaElementType_float64 11
#define OgaElementType_uint32 12
#define OgaElementType_uint64 13

/* ---------------------------------------------------------------------------------------------
 * Results. Any thread.
 * ------------------------------------------------------------------------------------------- */
/* The failure message, owned by `result` and valid until OgaDestroyResult(result). NULL -> NULL. */
OGA_EXPORT const char* OGA_API_CALL OgaResultGetError(const OgaResult* result);
/* Frees a result returned by any function of this API. NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyResult(OgaResult* result);

/* ---------------------------------------------------------------------------------------------
 * Models and configurations. Any thread.
 *
 * `config_path` is a model directory holding genai_config.json (as in 0.18) or the path of that
 * file itself, UTF-8. A file that cannot be read fails "Error opening <file>"; a positioned JSON
 * error fails "Error encountered while parsing '<file>' <what, where>"; checks of the whole
 * configuration say which keys are wrong. A model handle is a reference to a shared model: engines
 * and generator parameters created from it hold their own references, so destroying the handle
 * never invalidates them.
 * ------------------------------------------------------------------------------------------- */
/* Loads a model directory (genai_config.json + the decoder's ONNX file) into a new model, *out,
 * released with OgaDestroyModel. The core validates the configuration, then the registered model
 * loader (oga_ext.h, OgaExtSetModelLoader) opens the decoder and checks it against the configured
 * names; its reason is this call's error. The Python package registers that loader when `oga` is
 * imported; without one, loading fails "No model loader is registered: ...". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateModel(const char* config_path, OgaModel** out);
/* Releases the caller's reference; engines and generator parameters created from the model keep it
 * alive, and the model (its executor's release_model included) goes away with the last of them.
 * NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyModel(OgaModel* model);

/* Reads and validates a model directory's configuration into a new handle, *out, released with
 * OgaDestroyConfig, to adjust before creating the model (OgaCreateModelFromConfig). Errors as for
 * OgaCreateModel, without loading the decoder. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateConfig(const char* config_path, OgaConfig** out);
/* NULL-safe. Models created from the configuration do not depend on it. */
OGA_EXPORT void OGA_API_CALL OgaDestroyConfig(OgaConfig* config);
/* Merges the JSON document `json` into the configuration: objects merge key by key, any other value
 * (arrays included) replaces the old one. The merged copy is validated in full and published only
 * on success; syntax errors point into `json`, e.g. an overlay of {"search":{"num_beams":1}} fixes
 * a model default the Engine rejects. Do not call concurrently with another use of `config`. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaConfigOverlay(OgaConfig* config, const char* json);
/* Execution providers: edits of model.decoder.session_options.provider_options, a list of
 * {"<provider>": {"<key>": "<value>", ...}} entries in priority order (the list and the sections
 * above it are created when missing). Clear removes every entry; Append adds an entry for
 * `provider` unless it has one; SetProviderOption sets one string option, adding the provider's
 * entry when missing. An empty `provider` fails "provider must not be empty."; each edit is
 * validated and published like an overlay. Whether a provider is usable is decided when the model
 * is loaded, not here. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaConfigClearProviders(OgaConfig* config);
OGA_EXPORT OgaResult* OGA_API_CALL OgaConfigAppendProvider(OgaConfig* config, const char* provider);
OGA_EXPORT OgaResult* OGA_API_CALL OgaConfigSetProviderOption(OgaConfig* config, const char* provider, const char* key,
                                                              const char* value);
/* Loads the model of `config` (its directory, with the configuration's current contents) into a new
 * model, *out; as OgaCreateModel otherwise. `config` is only read: it stays the caller's and may be
 * edited or destroyed right after. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateModelFromConfig(const OgaConfig* config, OgaModel** out);

/* ---------------------------------------------------------------------------------------------
 * Generator parameters: the search settings of a Generator, and the seed-era request defaults of
 * OgaExtEngineCreateRequestWithParams (0.18's Engine takes every default from the model's search
 * section). Any thread; not thread-safe per object.
 * ------------------------------------------------------------------------------------------- */
/* A copy of the model's search section (search.max_length defaults to context_length) in a new
 * handle, *out, released with OgaDestroyGeneratorParams; it keeps a reference to the model. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateGeneratorParams(const OgaModel* model, OgaGeneratorParams** out);
/* NULL-safe. Requests created from the parameters keep their own copy of the values. */
OGA_EXPORT void OGA_API_CALL OgaDestroyGeneratorParams(OgaGeneratorParams* params);
/* Sets search option `name` of the copy. Names (0.18's): numbers batch_size, chunk_size,
 * diversity_penalty, length_penalty, max_length, min_length, no_repeat_ngram_size, num_beams,
 * num_return_sequences, random_seed (negative = unseeded), repetition_penalty, temperature, top_k,
 * top_p (the integer ones must be int32 integers); bools do_sample, early_stopping,
 * past_present_share_buffer. Unknown names and the wrong setter fail with 0.18's texts. Values are
 * validated where they are used: a Generator checks them when it is created (beam search,
 * num_beams > 1, is refused); OgaExtEngineCreateRequestWithParams rejects num_beams != 1,
 * min_length != 0 and max_length <= 0 (batch_size is ignored there, as in 0.18), and
 * OgaRequestBeginTurn checks the sampling values (see Turn options). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsSetSearchNumber(OgaGeneratorParams* params, const char* name, double value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsSetSearchBool(OgaGeneratorParams* params, const char* name, bool value);
/* "<name> is an invalid name for GetSearchNumber." / "... GetSearchBool." for names of the other kind. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsGetSearchNumber(const OgaGeneratorParams* params, const char* name, double* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsGetSearchBool(const OgaGeneratorParams* params, const char* name, bool* out);
/* Whole-generation guidance: type json_schema, regex or lark_grammar (empty type clears it). The
 * grammar is compiled when a Generator's turn begins. enable_ff_tokens (fast-forward tokens) is not
 * supported and fails. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsSetGuidance(OgaGeneratorParams* params, const char* type, const char* data,
                                                                 bool enable_ff_tokens);
/* Speculative-decoding options of 0.18's Generator: not supported by oga (they fail, naming README
 * 'Not supported by oga'). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsSetSpeculativeNumber(OgaGeneratorParams* params, const char* name, double value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsSetSpeculativeBool(OgaGeneratorParams* params, const char* name, bool value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsGetSpeculativeNumber(const OgaGeneratorParams* params, const char* name, double* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsGetSpeculativeBool(const OgaGeneratorParams* params, const char* name, bool* out);

/* ---------------------------------------------------------------------------------------------
 * Generator: 0.18's token-by-token loop on the engine core (src/compat/generator.h). batch_size rows,
 * each one sequence; every OgaGenerator_GenerateNextToken gives each unfinished row one token.
 * Calls may come from any thread, one at a time (not concurrently), except
 * OgaGenerator_SetRuntimeOption and OgaGenerator_IsSessionTerminated, which may run while another
 * thread generates. Beam search (num_beams > 1) is refused at creation.
 * ------------------------------------------------------------------------------------------- */
/* Checks the parameters (0.18's texts: max_length within context_length, batch_size in [1, 32],
 * num_return_sequences 1) and creates the Generator's own engine. The Generator keeps the model. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateGenerator(const OgaModel* model, const OgaGeneratorParams* params,
                                                      OgaGenerator** out);
OGA_EXPORT void OGA_API_CALL OgaDestroyGenerator(OgaGenerator* generator);
/* True once every row ended (EOS) or the sequences reached max_length; false before any input and
 * for NULL. A terminated session reports true (the Python binding raises instead, as 0.18 does). */
OGA_EXPORT bool OGA_API_CALL OgaGenerator_IsDone(OgaGenerator* generator);
OGA_EXPORT bool OGA_API_CALL OgaGenerator_IsSessionTerminated(const OgaGenerator* generator);
/* "terminate_session" with "1" or "0": while set, generation calls fail with "Session in Terminated
 * state, exiting!" (a running GenerateNextToken stops before its next step). Other keys fail. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_SetRuntimeOption(OgaGenerator* generator, const char* key, const char* value);
/* Appends input: `input_ids_count` tokens, batch_size rows of equal length (a right-padded block;
 * the pad token after a row's last real token is not model input). Copied. For batch_size > 1 only
 * once (until RewindTo(0)). The model runs when GenerateNextToken or GetLogits needs it. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_AppendTokens(OgaGenerator* generator, const int32_t* input_ids,
                                                             size_t input_ids_count);
/* One sequence per row, of any lengths (right-padded with the pad token to the longest). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_AppendTokenSequences(OgaGenerator* generator, const OgaSequences* sequences);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_GenerateNextToken(OgaGenerator* generator);
/* *out: borrowed array of one token per row (the last token of each sequence), valid until the
 * next call that changes the Generator. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_GetNextTokens(const OgaGenerator* generator, const int32_t** out, size_t* out_count);
/* Keeps the first new_length tokens (batch_size > 1: only 0, which clears every row). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_RewindTo(OgaGenerator* generator, size_t new_length);
/* Sequence length (every row has the same); 0 for NULL. */
OGA_EXPORT size_t OGA_API_CALL OgaGenerator_TokenCount(const OgaGenerator* generator);
/* Length and borrowed data of row `index` (valid until the next call that changes the Generator);
 * 0 / NULL for NULL or an index out of range (0.18 reads past its rows). */
OGA_EXPORT size_t OGA_API_CALL OgaGenerator_GetSequenceCount(const OgaGenerator* generator, size_t index);
OGA_EXPORT const int32_t* OGA_API_CALL OgaGenerator_GetSequenceData(const OgaGenerator* generator, size_t index);
/* *out: a new float32 tensor [batch_size, 1, vocab_size] (owned by the caller; OgaDestroyTensor) of
 * every row's next-token logits; rows that ended read 0. Runs the model on pending input first. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_GetLogits(OgaGenerator* generator, OgaTensor** out);
/* Replaces the next-token logits (float32, batch_size * vocab_size elements, any shape); the next
 * GenerateNextToken selects from them. Only after AppendTokens or GetLogits (0.18's rule). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_SetLogits(OgaGenerator* generator, OgaTensor* tensor);
/* Owned snapshot (the Generator verifies no drafts: every count is 0); OgaDestroySpeculativeStats. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_GetSpeculativeStats(const OgaGenerator* generator, OgaSpeculativeStats** out);
/* Model inputs and outputs by name, hidden states and state snapshots of 0.18's Generator: not
 * supported by oga (each fails, naming README 'Not supported by oga'). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_SetInputs(OgaGenerator* generator, const OgaNamedTensors* named_tensors);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_SetModelInput(OgaGenerator* generator, const char* name, OgaTensor* tensor);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_GetInput(const OgaGenerator* generator, const char* name, OgaTensor** out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_GetOutput(const OgaGenerator* generator, const char* name, OgaTensor** out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_SetHiddenStates(OgaGenerator* generator, OgaTensor* hidden_states);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGenerator_SnapshotState(OgaGenerator* generator);

/* ---------------------------------------------------------------------------------------------
 * The step API of onnxruntime-genai 0.10-0.15 (a compatibility form on the same engine; see
 * src/compat/step_requests.h). A request created by OgaCreateRequest collects its prompt with
 * OgaRequestAddTokens, is added to an engine, and reads the tokens the engine generates for it
 * after OgaEngineStep hands it back. Such a request is used with these functions only (the turn
 * functions above refuse it), and an engine serving such requests is driven by OgaEngineStep (its
 * OgaEngineRun is refused). Release with OgaDestroyRequest (any thread): the engine then removes it.
 * ------------------------------------------------------------------------------------------- */
/* A request with the search settings of `params` (copied): max_length caps its sequence, sampling
 * settings make its turn policy, min_length is a floor on the sequence per turn. Refused, with the
 * Generator's texts where it has them: num_beams != 1, batch_size != 1, num_return_sequences != 1,
 * max_length above the model's context_length, and guidance on the params. Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateRequest(const OgaGeneratorParams* params, OgaRequest** out);
/* Any thread. Exactly one sequence. Before the request is added: its prompt. Once its turn is
 * complete: a continuation (as OgaRequestContinue). While it waits for admission or generates:
 * refused ("Cannot add tokens to a request that is waiting for admission to the engine." / "Cannot
 * add tokens while the request is generating; ..."). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestAddTokens(OgaRequest* request, const OgaSequences* tokens);
/* Any thread. The next turn's input of a request whose turn is complete (the engine keeps its cache). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestContinue(OgaRequest* request, const OgaSequences* tokens);
/* Any thread. Generated tokens not read yet; reading one past the end fails with "All tokens have
 * been seen." */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestHasUnseenTokens(const OgaRequest* request, bool* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestGetUnseenToken(OgaRequest* request, int32_t* out);
/* Any thread. The current turn ended (EOS or max_length) or the request was removed (0.13's IsDone;
 * IsTurnComplete is the later name). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestIsDone(const OgaRequest* request, bool* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestIsTurnComplete(const OgaRequest* request, bool* out);
/* Any thread. One pointer for the caller, never dereferenced by oga. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestSetOpaqueData(OgaRequest* request, void* data);
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestGetOpaqueData(OgaRequest* request, void** out);
/* Any thread. On the owner thread the request is admitted now (its errors are this call's); from
 * another thread it is queued for the owner thread, which admits it at its next OgaEngineStep or
 * OgaEngineHasPendingRequests. A request can be added once ("Cannot add the request to the engine
 * since it is already assigned.") and needs tokens ("Cannot schedule a request with no tokens."). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineAddRequest(OgaEngine* engine, OgaRequest* request);
/* Any thread (queued for the owner thread like OgaEngineAddRequest). Stops the request and releases
 * its cache; tokens generated before stay readable, no more come. A request of another engine is
 * refused. Idempotent. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineRemoveRequest(OgaEngine* engine, OgaRequest* request);
/* [owner] *out: the next request with unread tokens (borrowed: the caller's own handle), running
 * one engine step when none has any; NULL when there is nothing to do. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineStep(OgaEngine* engine, OgaRequest** out);

/* ---------------------------------------------------------------------------------------------
 * Tensors. Any thread.
 * ------------------------------------------------------------------------------------------- */
/* With `data`, the tensor borrows it (the caller keeps it alive and unchanged in size); with NULL,
 * it owns zeroed storage. Dimensions must not be negative; string tensors are not supported. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateTensorFromBuffer(void* data, const int64_t* shape_dims, size_t shape_dims_count,
                                                             OgaElementType element_type, OgaTensor** out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTensorGetType(OgaTensor* tensor, OgaElementType* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTensorGetShapeRank(OgaTensor* tensor, size_t* out);
/* shape_dims_count must equal the rank. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTensorGetShape(OgaTensor* tensor, int64_t* shape_dims, size_t shape_dims_count);
/* *out: the tensor's elements, valid as long as the tensor. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTensorGetData(OgaTensor* tensor, void** out);
OGA_EXPORT void OGA_API_CALL OgaDestroyTensor(OgaTensor* tensor);

/* ---------------------------------------------------------------------------------------------
 * Engine lifecycle
 * ------------------------------------------------------------------------------------------- */
/* Creates an engine for `model` into *out, released with OgaDestroyEngine; the calling thread
 * becomes its owner thread for good. The engine shares ownership of `model`, so the caller may
 * destroy its model handle right after. Dynamic (continuous) batching iff the model config has a
 * non-empty engine.dynamic_batching; otherwise the static path (seed: "Static engine path").
 * Creation sizes the paged KV cache (engine.dynamic_batching.num_blocks, or automatically from
 * gpu_utilization_factor when the executor reports its block size) and opens the executor's
 * per-engine state; configuration errors say what to change, an executor failure reads "The model
 * executor could not prepare the engine: <reason>". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateEngine(OgaModel* model, OgaEngine** out);
/* Closes every bound request (surviving request handles become closed tombstones that must still
 * be destroyed), discards retained events, frees cache storage and closes the executor's per-engine
 * state. Event buffers of the engine stay readable and must still be destroyed, but can never run
 * again. Call on the owner thread, never from an executor callback, and not concurrently with any
 * other call on the engine (there is no check). NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyEngine(OgaEngine* engine);
/* [owner] Reclaims abandoned requests (OgaDestroyRequest), then *out = true iff retained events are
 * waiting to be delivered or some turn is queued or generating (also: step-API requests queued from
 * other threads or holding unread tokens; see OgaEngineStep). TurnComplete requests do not count.
 * A poisoned engine reports only its retained events (false once they are drained). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineHasPendingRequests(OgaEngine* engine, bool* out);
/* [owner] *out = the most draft tokens one OgaRequestSetDraftTokens proposal may hold (at most 7,
 * below max_scheduled_tokens, and below search.chunk_size with a sliding-window ring); 0 when the engine
 * cannot verify drafts (a static engine, an executor without per-token logits, a hybrid model
 * whose executor does not capture per-token state, max_scheduled_tokens 1). A capability, not a
 * promise that the next step has room (seed: "Caller-supplied speculative drafts"). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineMaxDraftTokensPerProposal(const OgaEngine* engine, size_t* out);
/* [owner] An owned snapshot of the engine's limits in *out; release with
 * OgaDestroyEngineCapabilities. The snapshot does not depend on the engine. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineGetCapabilities(const OgaEngine* engine, OgaEngineCapabilities** out);
/* Capability getters: any thread; NULL -> 0. */
/* Rows per step and resident requests: engine.dynamic_batching.max_batch_size, or on the static
 * path engine.static_batching.max_batch_size. */
OGA_EXPORT size_t OGA_API_CALL OgaEngineCapabilitiesGetConfiguredMaxBatchSize(const OgaEngineCapabilities* capabilities);
/* Packed tokens per step (engine.dynamic_batching.max_scheduled_tokens); 0 for static engines. */
OGA_EXPORT size_t OGA_API_CALL OgaEngineCapabilitiesGetMaxScheduledTokens(const OgaEngineCapabilities* capabilities);
/* The longest sequence (prompts, generated tokens and continuations of all turns) one request can
 * reach: min(context_length, num_blocks * block_size + 1), the last sampled token needing no KV
 * slot; 0 for static engines (their bound is search.max_length). */
OGA_EXPORT uint64_t OGA_API_CALL OgaEngineCapabilitiesGetMaxRequestLength(const OgaEngineCapabilities* capabilities);
/* Any thread. NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyEngineCapabilities(OgaEngineCapabilities* capabilities);

/* [owner] An owned snapshot of the engine's cumulative speculative telemetry (caller-supplied
 * drafts) in *out; release with OgaDestroySpeculativeStats. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineGetSpeculativeStats(const OgaEngine* engine, OgaSpeculativeStats** out);
/* Any thread. NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroySpeculativeStats(OgaSpeculativeStats* stats);
/* Snapshot getters: any thread; the snapshot is immutable. Every key name of 0.18 is accepted; an
 * unknown one fails "<name> is an invalid name for OgaSpeculativeStatsGet<Count|Number|Bool>.". oga
 * fills the counts rounds, completed_rounds, draft_tokens_proposed, draft_tokens_evaluated,
 * draft_tokens_accepted, correction_tokens, bonus_tokens, tokens_emitted, target_forward_passes,
 * target_verify_forward_passes, full_accept_rounds, partial_accept_rounds, zero_accept_rounds and
 * the numbers acceptance_rate, avg_draft_tokens_per_round, mean_emitted_tokens_per_round (0 when
 * their denominator is 0); 0.18's other keys (engine-hosted drafters, timings) read 0 and
 * formula_supported reads false. A NULL stats, name or value fails "stats, name, and value must not
 * be null." (the histogram getters: "stats and value must not be null."). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetCount(const OgaSpeculativeStats* stats, const char* name, uint64_t* value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetNumber(const OgaSpeculativeStats* stats, const char* name, double* value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetBool(const OgaSpeculativeStats* stats, const char* name, bool* value);
/* Verification rounds by number of accepted drafts: *out = the histogram's size (8: 0 .. 7 accepted
 * drafts); GetAcceptanceLengthCount reads entry `length` < that size, else fails "length <n> is
 * outside the acceptance length histogram.". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetAcceptanceLengthHistogramSize(const OgaSpeculativeStats* stats, size_t* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetAcceptanceLengthCount(const OgaSpeculativeStats* stats, size_t length, uint64_t* out);

/* ---------------------------------------------------------------------------------------------
 * Request options (session policy). Any thread; not bound to an engine; reusable: request creation
 * copies them.
 * ------------------------------------------------------------------------------------------- */
/* A new options handle with nothing set, *out; release with OgaDestroyRequestOptions. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateRequestOptions(OgaRequestOptions** out);
/* NULL-safe. Requests created with the options do not depend on them. */
OGA_EXPORT void OGA_API_CALL OgaDestroyRequestOptions(OgaRequestOptions* options);
/* The request-wide cap on its whole sequence (first prompt, every generated token and every
 * continuation input, over all turns; reaching it ends the turn with MaxSessionTokens). 0 = unset:
 * min(search.max_length, max_request_length). Stored as given; request creation checks it,
 * failing "max_session_tokens (<v>) must be greater than zero and no greater than the Engine's
 * max_request_length (<m>)." above the engine's max_request_length (static engines: above
 * search.max_length, with that wording). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestOptionsSetMaxSessionTokens(OgaRequestOptions* options, uint64_t max_session_tokens);

/* ---------------------------------------------------------------------------------------------
 * Requests (seed: "Request lifecycle")
 *
 * A request is one sequence that lives across turns: Unassigned -> (BeginTurn) Assigned ->
 * Active -> TurnComplete -> (BeginTurn) Assigned ...; Close from any state -> Closed. A closed
 * request's handle stays valid (a tombstone) until OgaDestroyRequest; every operation of this header
 * on it but Close and Destroy fails ("Cannot use a closed request." unless said otherwise). Engine
 * destruction closes every request.
 * ------------------------------------------------------------------------------------------- */
/* [owner] Creates an Unassigned request bound to `engine` into *out; release it with
 * OgaDestroyRequest (it is the request's one external handle). `request_options` may be NULL (all
 * unset); it is copied. Search defaults come from the model's search section; creation fails, with
 * texts that say how to fix the config, when search.num_beams != 1, search.min_length != 0 or
 * search.max_length <= 0, and on the max_session_tokens check above. Also fails with the stored
 * message of a poisoned engine. Creation queues nothing: HasPendingRequests is unchanged. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineCreateRequest(OgaEngine* engine, const OgaRequestOptions* request_options, OgaRequest** out);
/* [owner] Starts a turn: `input_ids_count` >= 1 token ids, each in [0, vocab_size), appended to the
 * request's sequence (a continuation's ids follow the previous turn's output; the caller supplies
 * any chat-template tokens). Valid for an Unassigned request, or a TurnComplete one whose events
 * are all delivered, whose last turn did not fail and whose model state is still resident. Copies
 * the tokens, snapshots `turn_options` (NULL = the request's search defaults; options of another
 * request fail "Turn options belong to a different or destroyed Request."), resolves and validates
 * the turn policy (see Turn options), loads the token table for stop strings and compiles a
 * grammar when the options ask for them. The input must leave room for at least one generated
 * token below max_session_tokens. On success *out_turn_id = the new turn id (1, 2, ...; ids are
 * never reused, a rewind included). On failure *out_turn_id = 0 (unless `request` was NULL),
 * nothing changes and no turn id is consumed. input_ids may be NULL only with count 0, which fails
 * "Expected at least one input token for generation. Received 0.". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestBeginTurn(OgaRequest* request, const OgaTurnOptions* turn_options,
                                                       const int32_t* input_ids, uint64_t input_ids_count,
                                                       uint64_t* out_turn_id);
/* [owner] If `turn_id` names the request's current turn and that turn is queued or generating:
 * ends it with reason Cancelled, keeps what it committed (tokens already generated stay in the
 * sequence), publishes its one terminal event (merged into a retained token event of the turn when
 * there is one) and sets *out_cancelled = true. Completed, stale, unknown, zero or future ids set
 * false and succeed. Fails "Cannot cancel a request before a turn has begun." before the first turn
 * and "Cannot cancel after the request's engine has been destroyed." on a closed request (0.18's
 * text, also when only the request was closed). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestCancelTurn(OgaRequest* request, uint64_t turn_id, bool* out_cancelled);
/* [owner] Truncates the request's sequence back to where turn `turn_id` began (any turn the request
 * still holds, the last one included), discarding that turn and every later one, which can no longer be
 * rewound to; the next BeginTurn gets a fresh id. Dynamic engines release the request's cache blocks
 * and residency as 0.18 does: the next turn prefills the kept history again (through the prefix cache
 * when its blocks are still indexed). Requires a TurnComplete request whose events are all delivered,
 * whose last turn did not fail and whose model state is resident (a static engine: the only row of its
 * batch). Errors: "Cannot rewind a closed request.", "Request rewind is only valid after the current
 * turn is complete.", "Cannot rewind to unknown Turn ID <id>." (0 included), and the pending-event,
 * failed-turn and residency texts of BeginTurn, with "rewind"
 * (docs/onnxruntime-genai-0.18-dynamic-engine.md, "Rewind (`rewind_to_start_of_turn`)"). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestRewindToStartOfTurn(OgaRequest* request, uint64_t turn_id);
/* [owner; any thread once the request is closed, engine destruction included] Legal in every state and
 * idempotent: stops scheduling, purges the request's undelivered events, releases its cache blocks (and
 * fixed-state slot) immediately; a resident row of a static batch stays allocated, unsampled, until the
 * batch is recycled. No terminal event is published for a turn closed mid-way. The handle stays to be
 * destroyed. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestClose(OgaRequest* request);
/* [owner] Replaces the request's pending speculative proposal for its next decode with the one
 * sequence of `tokens` (seed: "Caller-supplied speculative drafts"); zero sequences, or one empty
 * sequence, clear it in any state. More than one sequence fails "Request draft tokens must contain
 * at most one sequence.". A non-empty proposal needs an Active request (ready to decode), an engine
 * that verifies drafts (OgaEngineMaxDraftTokensPerProposal > 0, and at most that many tokens), a
 * greedy unguided turn with repetition_penalty 1, no_repeat_ngram_size 0 and its minimum generated
 * count reached, and ids in [0, vocab_size); each violation has its own message. The proposal is
 * consumed by the next committed decode, kept across a rolled-back step and discarded when the turn
 * ends. `tokens` is copied. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestSetDraftTokens(OgaRequest* request, const OgaSequences* tokens);
/* Any thread. Releases the external handle: `request` is invalid afterwards, and events that named
 * it report a NULL request from now on. An open request is abandoned: the engine closes it at its
 * next owner-thread boundary (request creation, BeginTurn, a positive-capacity Run,
 * HasPendingRequests, ...; a step-API request at its engine's next OgaEngineStep or
 * OgaEngineHasPendingRequests) and frees it; turn options bound to it keep working until then and
 * fail "Cannot use Turn options after their Request has been destroyed." afterwards. NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyRequest(OgaRequest* request);

/* ---------------------------------------------------------------------------------------------
 * Turn options (per-turn policy)
 *
 * Bound to one request (weakly: they do not keep it alive) and reusable across its turns:
 * BeginTurn snapshots them. Every option left unset means the request's search default for that
 * turn, never what an earlier turn used. [owner] for everything but destroy; every setter except
 * SetStopStrings, SetGuidance and SetDelimitedGuidance only stores its value, and BeginTurn
 * validates the resolved policy (0.18's texts). Setters fail "options must not be null.", "Cannot
 * use Turn options after their Request has been destroyed." once the request's engine reclaimed a
 * destroyed request, and "Cannot use a closed request." when the request is closed (also by engine
 * destruction).
 *
 * Greedy: a turn whose resolved do_sample is false, top_k is 1 or temperature is 0 selects the top
 * logit and draws no randomness. In a greedy turn an explicitly set temperature other than 0 or 1,
 * top_p strictly between 0 and 1, or top_k above 1 contradicts the policy and fails BeginTurn ("The
 * resolved turn policy selects the top logit (...)"); so does an explicit do_sample = true that a
 * model default top_k 1 or temperature 0 would silently override. A sampled turn needs top_k > 0
 * or top_p > 0, and top_k <= vocab_size.
 * ------------------------------------------------------------------------------------------- */
/* [owner] New options bound to `request`, nothing set, into *out; release with
 * OgaDestroyTurnOptions. Fails "Cannot use a closed request." for a closed request. *out is left
 * untouched when `request` is NULL (as in 0.18). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestCreateTurnOptions(OgaRequest* request, OgaTurnOptions** out);
/* Any thread (not concurrently with a use of the options). NULL-safe; outlives or predeceases its
 * request freely. */
OGA_EXPORT void OGA_API_CALL OgaDestroyTurnOptions(OgaTurnOptions* options);
/* Ends the turn after this many generated tokens (MaxGeneratedTokens). 0 = no per-turn cap, only
 * max_session_tokens. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetMaxGeneratedTokens(OgaTurnOptions* options, uint64_t max_generated_tokens);
/* EOS cannot be selected until the turn generated this many tokens. 0 = no floor. BeginTurn requires
 * it <= max_generated_tokens (when that is set) and <= max_session_tokens minus the sequence length
 * after the turn's input. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetMinGeneratedTokens(OgaTurnOptions* options, uint64_t min_generated_tokens);
/* false selects the top logit (greedy); true samples unless top_k is 1 or temperature is 0. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetDoSample(OgaTurnOptions* options, bool do_sample);
/* Finite and >= 0 (BeginTurn: "temperature (<x>) must be finite and 0 or greater."). 0 = greedy. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetTemperature(OgaTurnOptions* options, float temperature);
/* Nucleus sampling: finite, in [0, 1] ("top_p (<x>) must be finite and between 0.0 and 1.0.").
 * Only 0 < top_p < 1 cuts; 0 and 1 keep every candidate top_k left. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetTopP(OgaTurnOptions* options, float top_p);
/* >= 0 ("top_k (<n>) must be 0 or greater."); 0 = no top-k cut, 1 = greedy; a sampled turn needs
 * top_k <= vocab_size. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetTopK(OgaTurnOptions* options, int32_t top_k);
/* Finite and > 0 ("repetition_penalty (<x>) must be finite and greater than zero."); 1 = none.
 * Every distinct token already in the sequence has a positive logit divided by it, a negative one
 * multiplied. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetRepetitionPenalty(OgaTurnOptions* options, float repetition_penalty);
/* >= 0 ("no_repeat_ngram_size (<n>) must be 0 or greater."): no token may complete an n-gram that
 * already occurs in the sequence. 0 turns the ban off (a value, overriding the model's default). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetNoRepeatNgramSize(OgaTurnOptions* options, int32_t no_repeat_ngram_size);
/* Reseeds the request's random stream at the turn's first sampling step (durable once a sampled
 * step commits); any value, 0 included: a turn seeded with s draws as a request whose
 * search.random_seed is s. Dynamic engines only: a static engine fails BeginTurn "A per-turn seed
 * requires an Engine configured for dynamic batching.". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetSeed(OgaTurnOptions* options, uint64_t seed);
/* Removes a seed set on these options: the turn continues the request's stream. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsClearSeed(OgaTurnOptions* options);
/* Copied and validated now; on failure the previous stop strings stay. At most 16 entries ("Too
 * many stop strings: <n>, the maximum is 16."), at most 16384 bytes in all, each non-empty and valid
 * UTF-8 ("Stop string at index <i> is empty." / "... is not valid UTF-8."); an empty array clears.
 * A turn ends with StopString when the text decoded from its own generated tokens contains one of
 * them; the token completing the match is emitted, and the event reports the matched index. Needs
 * the model's token table (BeginTurn fails if it cannot be loaded) and a dynamic engine (a static
 * one fails BeginTurn "Stop strings require an Engine configured for dynamic batching.").
 * `stop_strings` NULL fails "stop_strings must not be null."; it stays the caller's. Observed 0.18
 * behaviour: docs/onnxruntime-genai-0.18-dynamic-engine.md, "Stop strings and guidance". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetStopStrings(OgaTurnOptions* options, const OgaStringArray* stop_strings);
/* Whole-turn guidance (seed: "Constrained decoding and tool calling"): every generated token must
 * keep the output valid for the grammar. guidance_type is json_schema, regex or lark_grammar
 * ("Unsupported guidance type: <t> (...)"); both strings are copied and must be non-empty ("Guidance
 * type and data must be provided together."); NULL fails "guidance_type and guidance_data must not
 * be null.". Fails "Whole-turn guidance conflicts with delimited guidance. ..." while delimited
 * guidance is set. The grammar is compiled by BeginTurn, which fails "Invalid <type> guidance: ..."
 * for a bad grammar, and when llguidance (OgaExtSetGuidanceLibrary) or the token table is missing.
 * A turn whose grammar later allows no token ends Failed (RequestUnserviceable). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetGuidance(OgaTurnOptions* options, const char* guidance_type, const char* guidance_data);
/* NOT SUPPORTED by oga yet: the setter stores and checks its arguments as 0.18 does (a non-NULL,
 * non-empty `grammar`; distinct nonnegative marker tokens; no whole-turn guidance set), but
 * BeginTurn with these options fails "Delimited guidance (OgaTurnOptionsSetDelimitedGuidance) is not
 * supported yet by oga. Remove it from the turn options." (on a static engine: "Delimited guidance
 * requires an Engine configured for dynamic batching."). Clear it with OgaTurnOptionsClearGuidance
 * or OgaTurnOptionsReset. In 0.18: a Lark grammar applied only between opening_token and
 * closing_token. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetDelimitedGuidance(OgaTurnOptions* options, int32_t opening_token,
                                                                       int32_t closing_token, const char* grammar);
/* Removes whole-turn and delimited guidance. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsClearGuidance(OgaTurnOptions* options);
/* Unsets every option (limits, sampling, seed, stop strings, guidance). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsReset(OgaTurnOptions* options);

/* ---------------------------------------------------------------------------------------------
 * Event buffers, Run, events, usage (seed: "Engine::Run() and event draining")
 * ------------------------------------------------------------------------------------------- */
/* [owner] A buffer of `capacity` preallocated event slots in *out; release with
 * OgaDestroyEngineEventBuffer. 0 is allowed (runs on it are no-ops); above 2^24 fails "Engine event
 * capacity exceeds the supported size.". Bound to `engine` for good, through a weak reference (it
 * does not keep the engine alive). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateEngineEventBuffer(OgaEngine* engine, size_t capacity, OgaEngineEventBuffer** out);
/* Any thread, not concurrently with a Run on it or a read of its events; invalidates every view
 * into it. Safe after the engine died. NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyEngineEventBuffer(OgaEngineEventBuffer* buffer);
/* [owner] Drain-or-execute: delivers retained events if any exist, otherwise runs at most one
 * transaction (one model step; none when nothing is runnable) and delivers up to the buffer's
 * capacity of its events, retaining the rest for the next calls. Reclaims abandoned requests
 * first. Zero events is a normal outcome (a partial prefill commits without an event): keep
 * running while OgaEngineHasPendingRequests says so. A buffer of another engine (live or
 * destroyed) fails "buffer must be used with the Engine that created it."; on such a validation
 * failure the buffer is untouched. A capacity-0 buffer validates, then does nothing. Refused while
 * the engine serves step-API requests (their events are OgaEngineStep's). A poisoned engine
 * delivers its retained failure events, then fails every Run with the stored message. A
 * positive-capacity Run that passed validation invalidates the buffer's earlier views even if it
 * fails afterwards (an allocation failure while planning: the engine stays healthy, the buffer is
 * empty). An interrupted executor callback (oga_ext.h, OgaExtExecutionStatus_Interrupted) rolls the
 * step back and makes Run return at once, successfully, with no events; the step's Retryable event
 * comes with the next Run. From an executor or device callback (a step in flight) Run fails
 * "Cannot run the engine while a step is in flight." and changes nothing. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineRun(OgaEngine* engine, OgaEngineEventBuffer* buffer);
/* Events delivered by the buffer's last Run (0 before the first). Any thread, not concurrently with
 * Run. NULL -> 0. */
OGA_EXPORT size_t OGA_API_CALL OgaEngineEventBufferGetCount(const OgaEngineEventBuffer* buffer);
/* Borrowed view of event `index`, in delivery order, valid as the header's conventions say; NULL
 * buffer or index >= count -> NULL. Any thread, not concurrently with Run. */
OGA_EXPORT const OgaEngineEvent* OGA_API_CALL OgaEngineEventBufferGet(const OgaEngineEventBuffer* buffer, size_t index);

/* Event getters: any thread (not concurrently with a Run on the event's buffer). Each writes the
 * zero value named below into *out first (when `out` is not NULL), then rejects a NULL event
 * ("event must not be null.") or out ("out must not be null."). Fields that the event's flags do
 * not call for hold their zero value. */
/* The event's bits; zero value OgaEngineEventFlag_None. Request events: Token and/or TurnFinished,
 * with Failed when the turn failed (the error code tells a request that can never fit,
 * RequestUnserviceable, from a poisoned engine). Engine-level events (no request): CapacityBlocked
 * or Retryable (nothing committed, the engine is healthy, run again), and Failed alone when the
 * engine was poisoned with no turn in progress. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetFlags(const OgaEngineEvent* event, OgaEngineEventFlags* out);
/* Borrowed alias equal to the caller's own handle of the event's request (never a handle to
 * destroy); NULL for engine-level events or once the caller destroyed its handle. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetRequest(const OgaEngineEvent* event, const OgaRequest** out);
/* The request-local turn id the event belongs to; 0 for engine-level events. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetTurnId(const OgaEngineEvent* event, uint64_t* out);
/* The generated token when the Token bit is set; 0 otherwise (0 may also be a real token). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetToken(const OgaEngineEvent* event, int32_t* out);
/* Why the turn ended when TurnFinished is set; OgaFinishReason_None otherwise. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetFinishReason(const OgaEngineEvent* event, OgaFinishReason* out);
/* Index into the turn's stop strings when the reason is StopString; -1 otherwise (zero value -1). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetMatchedStopStringIndex(const OgaEngineEvent* event, int32_t* out);
/* Set on CapacityBlocked, Retryable and Failed events (see OgaErrorCode); OgaErrorCode_None
 * otherwise, including Cancelled terminals. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetErrorCode(const OgaEngineEvent* event, OgaErrorCode* out);
/* Borrowed view of the turn's usage, living as the event does; never NULL for a valid event (zero
 * value NULL). Filled on TurnFinished events; all zero on token-only and engine-level events. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetUsage(const OgaEngineEvent* event, const OgaTurnUsage** out);
/* Usage getters: as the event getters, with "usage must not be null." and zero value 0. */
/* Input ids this turn's BeginTurn accepted (a continuation counts only its own input). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnUsageGetPromptTokens(const OgaTurnUsage* usage, uint64_t* out);
/* Tokens the turn generated and emitted (EOS not counted; tokens before a cancel counted). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnUsageGetGeneratedTokens(const OgaTurnUsage* usage, uint64_t* out);
/* Prompt tokens of this turn adopted from the prefix cache instead of computed (whole blocks only;
 * at least one prompt token is always computed); 0 without prefix caching
 * (docs/onnxruntime-genai-0.18-dynamic-engine.md, "Prefix caching"). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnUsageGetCachedPromptTokens(const OgaTurnUsage* usage, uint64_t* out);

/* ---------------------------------------------------------------------------------------------
 * String arrays and sequences: caller-owned containers (stop strings; draft tokens). Any thread;
 * not synchronized: do not modify one while another thread reads it.
 * ------------------------------------------------------------------------------------------- */
/* An empty array in *out; release with OgaDestroyStringArray. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateStringArray(OgaStringArray** out);
/* An array holding copies of strs[0 .. count) (NUL-terminated) in *out. strs may be NULL only when
 * count is 0; a NULL entry fails "strs[<i>] must not be null.". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateStringArrayFromStrings(const char* const* strs, size_t count, OgaStringArray** out);
/* Appends a copy of the NUL-terminated `str` (the empty string included). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaStringArrayAddString(OgaStringArray* string_array, const char* str);
/* *out = the number of strings. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaStringArrayGetCount(const OgaStringArray* string_array, size_t* out);
/* *out = string `index`, owned by the array and valid until the array is changed or destroyed. An
 * index >= count fails "index <i> is out of range for a string array of <n> strings.". */
OGA_EXPORT OgaResult* OGA_API_CALL OgaStringArrayGetString(const OgaStringArray* string_array, size_t index, const char** out);
/* NULL-safe; invalidates every string it returned. */
OGA_EXPORT void OGA_API_CALL OgaDestroyStringArray(OgaStringArray* string_array);

/* An empty list of sequences in *out; release with OgaDestroySequences. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateSequences(OgaSequences** out);
/* Appends a copy of token_ptr[0 .. token_cnt) as a new sequence (an empty one when token_cnt is 0,
 * where token_ptr may be NULL; NULL with a nonzero count fails). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaAppendTokenSequence(const int32_t* token_ptr, size_t token_cnt, OgaSequences* sequences);
/* The number of sequences. NULL -> 0. */
OGA_EXPORT size_t OGA_API_CALL OgaSequencesCount(const OgaSequences* sequences);
/* Tokens in sequence `sequence_index`. NULL sequences or an index >= OgaSequencesCount -> 0. */
OGA_EXPORT size_t OGA_API_CALL OgaSequencesGetSequenceCount(const OgaSequences* sequences, size_t sequence_index);
/* Borrowed pointer to the tokens of sequence `sequence_index`, valid until the next append to or
 * the destruction of `sequences`. NULL sequences or an index >= OgaSequencesCount -> NULL; an empty
 * sequence may give NULL too (read it with its count, 0). */
OGA_EXPORT const int32_t* OGA_API_CALL OgaSequencesGetSequenceData(const OgaSequences* sequences, size_t sequence_index);
/* NULL-safe; invalidates every pointer it returned. */
OGA_EXPORT void OGA_API_CALL OgaDestroySequences(OgaSequences* sequences);

#ifdef __cplusplus
}
#endif

#endif /* OGA_OGA_H_ */
