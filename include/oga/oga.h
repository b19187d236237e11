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

/* Seed-era request defaults (only used by OgaExtEngineCreateRequestWithParams). Any thread. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaCreateGeneratorParams(const OgaModel* model, OgaGeneratorParams** out);
OGA_EXPORT void OGA_API_CALL OgaDestroyGeneratorParams(OgaGeneratorParams* params);
/* Supported names: max_length, do_sample, top_k, top_p, temperature, repetition_penalty,
 * no_repeat_ngram_size, min_length, num_beams, batch_size, random_seed. Unknown names fail. */
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsSetSearchNumber(OgaGeneratorParams* params, const char* name, double value);
OGA_EXPORT OgaResult* OGA_API_CALL OgaGeneratorParamsSetSearchBool(OgaGeneratorParams* params, const char* name, bool value);

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
/* [owner] Reclaims abandoned requests, then *out = retained events exist or work is schedulable. */
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
 * its next owner-thread boundary (abandonment). NULL-safe. */
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
 * failure the buffer is untouched. */
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
