/*
 * oga.h -- the C API of oga: the experimental Engine API of ONNX Runtime GenAI 0.18.
 *
 * Names, signatures, constants and error texts follow onnxruntime-genai 0.18 so that code written
 * against its Engine runs unchanged. Additions that 0.18 does not have live in oga_ext.h and carry
 * the OgaExt prefix.
 *
 * Conventions (apply to every function below unless its comment says otherwise):
 * - Functions returning OgaResult* return NULL on success. A non-NULL result is owned by the caller
 *   and released with OgaDestroyResult; its message (OgaResultGetError) lives as long as it does.
 *   A failed call changes nothing: no handle, request, cache or event state is mutated.
 * - Misuse (NULL handles, bad ranges, wrong thread, wrong engine, illegal state) is reported only
 *   through OgaResult. Outcomes of OgaEngineRun (capacity, retryable, failures) are reported only
 *   through events and error codes. Do not parse message texts to classify outcomes.
 * - Owner thread: the thread that called OgaCreateEngine. Functions marked [owner] must be called
 *   on it; elsewhere they fail with "Engine operations must be called from the Engine owner thread."
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
typedef struct OgaConfig OgaConfig;                         /* model configuration (issue: models) */
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
typedef struct OgaStringArray OgaStringArray;
typedef struct OgaSequences OgaSequences;
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
 * Results
 * ------------------------------------------------------------------------------------------- */
/* Message owned by `result`, valid until OgaDestroyResult(result). NULL result -> NULL. Any thread. */
OGA_EXPORT const char* OGA_API_CALL OgaResultGetError(const OgaResult* result);
OGA_EXPORT void OGA_API_CALL OgaDestroyResult(OgaResult* result);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */
/* Loads an OGA model directory (genai_config.json + ONNX). Any thread. The ONNX Runtime executor
 * is registered by the Python package (import oga); without it, loading fails. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateModel(const char* config_path, OgaModel** out);
/* Releases the caller's reference; engines created from the model keep it alive. NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyModel(OgaModel* model);

/* Configuration of a model directory, to adjust before creating the model. Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateConfig(const char* config_path, OgaConfig** out);
OGA_EXPORT void OGA_API_CALL OgaDestroyConfig(OgaConfig* config);
/* Merges `json` into the configuration (objects merge key by key, other values replace). The
 * merged copy is validated in full and published only on success. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaConfigOverlay(OgaConfig* config, const char* json);
/* Execution providers of model.decoder.session_options.provider_options. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaConfigClearProviders(OgaConfig* config);
OGA_EXPORT OgaResult* OGA_API_CALL OgaConfigAppendProvider(OgaConfig* config, const char* provider);
OGA_EXPORT OgaResult* OGA_API_CALL OgaConfigSetProviderOption(OgaConfig* config, const char* provider, const char* key,
                                                              const char* value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateModelFromConfig(const OgaConfig* config, OgaModel** out);

/* ---------------------------------------------------------------------------------------------
 * Generator parameters: the search settings of a Generator (and of the seed-era
 * OgaExtEngineCreateRequestWithParams). Any thread; not thread-safe per object.
 * ------------------------------------------------------------------------------------------- */
/* A copy of the model's search section (search.max_length defaults to context_length). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateGeneratorParams(const OgaModel* model, OgaGeneratorParams** out);
OGA_EXPORT void OGA_API_CALL OgaDestroyGeneratorParams(OgaGeneratorParams* params);
/* Names (0.18's): numbers batch_size, chunk_size, diversity_penalty, length_penalty, max_length,
 * min_length, no_repeat_ngram_size, num_beams, num_return_sequences, random_seed (negative = none),
 * repetition_penalty, temperature, top_k, top_p (integer ones must be int32 integers); bools
 * do_sample, early_stopping, past_present_share_buffer. Unknown names and the wrong setter fail with
 * 0.18's texts. Values are validated when a Generator uses them. */
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
 * Generator: 0.18's token-by-token loop on the engine core (src/generator.h). batch_size rows,
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
 * src/step_requests.h). A request created by OgaCreateRequest collects its prompt with
 * OgaRequestAddTokens, is added to an engine, and reads the tokens the engine generates for it
 * after OgaEngineStep hands it back. Such a request is used with these functions only (the turn
 * functions above refuse it), and an engine serving such requests is driven by OgaEngineStep (its
 * OgaEngineRun is refused). Release with OgaDestroyRequest (any thread): the engine then removes it.
 * ------------------------------------------------------------------------------------------- */
/* A request with the search settings of `params` (copied): max_length caps its sequence, sampling
 * settings make its turn policy, min_length is a floor on the sequence per turn. Any thread. */
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
/* Creates an engine; the calling thread becomes its owner. The engine shares ownership of
 * `model`, so the caller may destroy its model handle right after. Dynamic (continuous) batching
 * iff the model config has a non-empty engine.dynamic_batching. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateEngine(OgaModel* model, OgaEngine** out);
/* Closes every bound request (surviving request handles become closed tombstones that must still
 * be destroyed), discards retained events, frees cache storage. Call on the owner thread. NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyEngine(OgaEngine* engine);
/* [owner] Reclaims abandoned requests, then *out = retained events exist or work is schedulable
 * (also: step-API requests queued from other threads or holding unread tokens; see OgaEngineStep). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineHasPendingRequests(OgaEngine* engine, bool* out);
/* [owner] Max caller-supplied draft tokens per proposal; 0 when unsupported. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineMaxDraftTokensPerProposal(const OgaEngine* engine, size_t* out);
/* [owner] Owned snapshot; release with OgaDestroyEngineCapabilities. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineGetCapabilities(const OgaEngine* engine, OgaEngineCapabilities** out);
/* Any thread. NULL -> 0. */
OGA_EXPORT size_t OGA_API_CALL OgaEngineCapabilitiesGetConfiguredMaxBatchSize(const OgaEngineCapabilities* capabilities);
OGA_EXPORT size_t OGA_API_CALL OgaEngineCapabilitiesGetMaxScheduledTokens(const OgaEngineCapabilities* capabilities);
/* min(context_length, num_blocks * block_size + 1); 0 for static engines. */
OGA_EXPORT uint64_t OGA_API_CALL OgaEngineCapabilitiesGetMaxRequestLength(const OgaEngineCapabilities* capabilities);
OGA_EXPORT void OGA_API_CALL OgaDestroyEngineCapabilities(OgaEngineCapabilities* capabilities);

/* [owner] Owned snapshot of cumulative speculative telemetry; release with OgaDestroySpeculativeStats. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineGetSpeculativeStats(const OgaEngine* engine, OgaSpeculativeStats** out);
OGA_EXPORT void OGA_API_CALL OgaDestroySpeculativeStats(OgaSpeculativeStats* stats);
/* Any thread. Unknown name -> "<name> is an invalid name for OgaSpeculativeStatsGetCount." */
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetCount(const OgaSpeculativeStats* stats, const char* name, uint64_t* value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetNumber(const OgaSpeculativeStats* stats, const char* name, double* value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetBool(const OgaSpeculativeStats* stats, const char* name, bool* value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetAcceptanceLengthHistogramSize(const OgaSpeculativeStats* stats, size_t* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaSpeculativeStatsGetAcceptanceLengthCount(const OgaSpeculativeStats* stats, size_t length, uint64_t* out);

/* ---------------------------------------------------------------------------------------------
 * Request options (session policy). Any thread; not bound to an engine; reusable.
 * ------------------------------------------------------------------------------------------- */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateRequestOptions(OgaRequestOptions** out);
OGA_EXPORT void OGA_API_CALL OgaDestroyRequestOptions(OgaRequestOptions* options);
/* 0 = unset (min(search.max_length, max_request_length)). Validated at request creation. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestOptionsSetMaxSessionTokens(OgaRequestOptions* options, uint64_t max_session_tokens);

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */
/* [owner] Creates an Unassigned request bound to `engine`. `request_options` may be NULL; it is
 * copied. The returned handle is the request's one external handle; release it with
 * OgaDestroyRequest. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineCreateRequest(OgaEngine* engine, const OgaRequestOptions* request_options, OgaRequest** out);
/* [owner] Starts a turn (request Unassigned, or TurnComplete with no undelivered event). Copies
 * the tokens, snapshots `turn_options` (NULL = model defaults), writes the new turn id (1, 2, ...).
 * On failure nothing changes and no turn id is consumed. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestBeginTurn(OgaRequest* request, const OgaTurnOptions* turn_options,
                                                       const int32_t* input_ids, uint64_t input_ids_count,
                                                       uint64_t* out_turn_id);
/* [owner] Cancels the current queued/active turn named by `turn_id` (*out_cancelled = true) and
 * publishes its terminal event; completed, stale, unknown, zero or future ids give false. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestCancelTurn(OgaRequest* request, uint64_t turn_id, bool* out_cancelled);
/* [owner] Rewind lands with the paged-cache features; until then it fails with a clear error. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestRewindToStartOfTurn(OgaRequest* request, uint64_t turn_id);
/* [owner; any thread once the engine is destroyed] Legal in every state and idempotent: stops
 * scheduling, purges the request's undelivered events, releases its cache blocks immediately. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestClose(OgaRequest* request);
/* [owner] Replaces the pending speculative proposal (at most one sequence; empty clears). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestSetDraftTokens(OgaRequest* request, const OgaSequences* tokens);
/* Any thread. Releases the external handle. The engine still holds the request and closes it at
 * its next owner-thread boundary (abandonment; a step-API request is removed at its engine's next
 * OgaEngineStep or OgaEngineHasPendingRequests). NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyRequest(OgaRequest* request);

/* ---------------------------------------------------------------------------------------------
 * Turn options (per-turn policy). [owner] for everything but destroy. Setters only store values;
 * BeginTurn validates the resolved policy.
 * ------------------------------------------------------------------------------------------- */
OGA_EXPORT OgaResult* OGA_API_CALL OgaRequestCreateTurnOptions(OgaRequest* request, OgaTurnOptions** out);
OGA_EXPORT void OGA_API_CALL OgaDestroyTurnOptions(OgaTurnOptions* options);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetMaxGeneratedTokens(OgaTurnOptions* options, uint64_t max_generated_tokens);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetMinGeneratedTokens(OgaTurnOptions* options, uint64_t min_generated_tokens);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetDoSample(OgaTurnOptions* options, bool do_sample);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetTemperature(OgaTurnOptions* options, float temperature);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetTopP(OgaTurnOptions* options, float top_p);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetTopK(OgaTurnOptions* options, int32_t top_k);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetRepetitionPenalty(OgaTurnOptions* options, float repetition_penalty);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetNoRepeatNgramSize(OgaTurnOptions* options, int32_t no_repeat_ngram_size);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetSeed(OgaTurnOptions* options, uint64_t seed);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsClearSeed(OgaTurnOptions* options);
/* Copied and validated now (<= 16 entries, <= 16384 bytes, non-empty, UTF-8); empty array clears. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetStopStrings(OgaTurnOptions* options, const OgaStringArray* stop_strings);
/* guidance_type: json_schema, regex or lark_grammar. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetGuidance(OgaTurnOptions* options, const char* guidance_type, const char* guidance_data);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsSetDelimitedGuidance(OgaTurnOptions* options, int32_t opening_token,
                                                                       int32_t closing_token, const char* grammar);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsClearGuidance(OgaTurnOptions* options);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnOptionsReset(OgaTurnOptions* options);

/* ---------------------------------------------------------------------------------------------
 * Event buffers, Run, events, usage
 * ------------------------------------------------------------------------------------------- */
/* [owner] Preallocates `capacity` event slots (0 allowed: runs are no-ops). Bound to `engine`
 * through a weak reference. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateEngineEventBuffer(OgaEngine* engine, size_t capacity, OgaEngineEventBuffer** out);
/* Any thread, not concurrently with a Run on it. Safe after the engine died. NULL-safe. */
OGA_EXPORT void OGA_API_CALL OgaDestroyEngineEventBuffer(OgaEngineEventBuffer* buffer);
/* [owner] Drain-or-execute: delivers retained events if any exist, otherwise runs at most one
 * transaction and delivers up to `capacity` of its events, retaining the rest. On a validation
 * failure the buffer is untouched. Refused while the engine serves step-API requests (their events
 * are OgaEngineStep's). */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineRun(OgaEngine* engine, OgaEngineEventBuffer* buffer);
/* Any thread (not concurrently with Run). NULL -> 0. */
OGA_EXPORT size_t OGA_API_CALL OgaEngineEventBufferGetCount(const OgaEngineEventBuffer* buffer);
/* Borrowed view; NULL buffer or index >= count -> NULL. */
OGA_EXPORT const OgaEngineEvent* OGA_API_CALL OgaEngineEventBufferGet(const OgaEngineEventBuffer* buffer, size_t index);

/* Event getters: any thread (not concurrently with Run). Each writes the zero value into *out
 * first, then rejects a NULL event. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetFlags(const OgaEngineEvent* event, OgaEngineEventFlags* out);
/* Borrowed alias equal to the caller's own handle; NULL for engine-level events or once the
 * caller destroyed its handle. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetRequest(const OgaEngineEvent* event, const OgaRequest** out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetTurnId(const OgaEngineEvent* event, uint64_t* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetToken(const OgaEngineEvent* event, int32_t* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetFinishReason(const OgaEngineEvent* event, OgaFinishReason* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetMatchedStopStringIndex(const OgaEngineEvent* event, int32_t* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetErrorCode(const OgaEngineEvent* event, OgaErrorCode* out);
/* Never NULL for a valid event; all zero on token-only and engine-level events. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaEngineEventGetUsage(const OgaEngineEvent* event, const OgaTurnUsage** out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnUsageGetPromptTokens(const OgaTurnUsage* usage, uint64_t* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnUsageGetGeneratedTokens(const OgaTurnUsage* usage, uint64_t* out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaTurnUsageGetCachedPromptTokens(const OgaTurnUsage* usage, uint64_t* out);

/* ---------------------------------------------------------------------------------------------
 * String arrays and sequences. Any thread.
 * ------------------------------------------------------------------------------------------- */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateStringArray(OgaStringArray** out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateStringArrayFromStrings(const char* const* strs, size_t count, OgaStringArray** out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaStringArrayAddString(OgaStringArray* string_array, const char* str);
OGA_EXPORT OgaResult* OGA_API_CALL OgaStringArrayGetCount(const OgaStringArray* string_array, size_t* out);
/* *out is owned by the array. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaStringArrayGetString(const OgaStringArray* string_array, size_t index, const char** out);
OGA_EXPORT void OGA_API_CALL OgaDestroyStringArray(OgaStringArray* string_array);

OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateSequences(OgaSequences** out);
OGA_EXPORT OgaResult* OGA_API_CALL OgaAppendTokenSequence(const int32_t* token_ptr, size_t token_cnt, OgaSequences* sequences);
OGA_EXPORT size_t OGA_API_CALL OgaSequencesCount(const OgaSequences* sequences);
OGA_EXPORT size_t OGA_API_CALL OgaSequencesGetSequenceCount(const OgaSequences* sequences, size_t sequence_index);
OGA_EXPORT const int32_t* OGA_API_CALL OgaSequencesGetSequenceData(const OgaSequences* sequences, size_t sequence_index);
OGA_EXPORT void OGA_API_CALL OgaDestroySequences(OgaSequences* sequences);

#ifdef __cplusplus
}
#endif

#endif /* OGA_OGA_H_ */
