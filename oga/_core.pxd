# cython: language_level=3
# C declarations of the oga C API (include/oga/oga.h and include/oga/oga_ext.h).
# Kept 1:1 with the headers; the extension types live in _core.pyx.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libcpp cimport bool as cbool


cdef extern from "oga/oga.h" nogil:
    ctypedef struct c_OgaResult "OgaResult"
    ctypedef struct c_OgaModel "OgaModel"
    ctypedef struct c_OgaConfig "OgaConfig"
    ctypedef struct c_OgaGeneratorParams "OgaGeneratorParams"
    ctypedef struct c_OgaEngine "OgaEngine"
    ctypedef struct c_OgaRequest "OgaRequest"
    ctypedef struct c_OgaRequestOptions "OgaRequestOptions"
    ctypedef struct c_OgaTurnOptions "OgaTurnOptions"
    ctypedef struct c_OgaEngineEventBuffer "OgaEngineEventBuffer"
    ctypedef struct c_OgaEngineEvent "OgaEngineEvent"
    ctypedef struct c_OgaTurnUsage "OgaTurnUsage"
    ctypedef struct c_OgaEngineCapabilities "OgaEngineCapabilities"
    ctypedef struct c_OgaSpeculativeStats "OgaSpeculativeStats"
    ctypedef struct c_OgaStringArray "OgaStringArray"
    ctypedef struct c_OgaSequences "OgaSequences"
    ctypedef struct c_OgaGenerator "OgaGenerator"
    ctypedef struct c_OgaTensor "OgaTensor"
    ctypedef struct c_OgaNamedTensors "OgaNamedTensors"
    ctypedef int32_t OgaElementType
    enum:
        OgaElementType_undefined
        OgaElementType_float32
        OgaElementType_uint8
        OgaElementType_int8
        OgaElementType_uint16
        OgaElementType_int16
        OgaElementType_int32
        OgaElementType_int64
        OgaElementType_string
        OgaElementType_bool
        OgaElementType_float16
        OgaElementType_float64
        OgaElementType_uint32
        OgaElementType_uint64

    ctypedef uint32_t OgaFinishReason
    ctypedef uint32_t OgaEngineEventFlags
    ctypedef uint32_t OgaErrorCode
    enum:
        OgaFinishReason_None
        OgaFinishReason_Eos
        OgaFinishReason_StopString
        OgaFinishReason_MaxGeneratedTokens
        OgaFinishReason_MaxSessionTokens
        OgaFinishReason_Cancelled
        OgaFinishReason_Failed
        OgaEngineEventFlag_None
        OgaEngineEventFlag_Token
        OgaEngineEventFlag_TurnFinished
        OgaEngineEventFlag_CapacityBlocked
        OgaEngineEventFlag_Failed
        OgaEngineEventFlag_Retryable
        OgaErrorCode_None
        OgaErrorCode_CapacityDeferred
        OgaErrorCode_ExecutionCapacityExceeded
        OgaErrorCode_RetryableExecution
        OgaErrorCode_RequestUnserviceable
        OgaErrorCode_EngineContractFailure
        OgaErrorCode_EngineExecutionFailure

    # Results
    const char* OgaResultGetError(const c_OgaResult* result)
    void OgaDestroyResult(c_OgaResult* result)

    # Models and configs
    c_OgaResult* OgaCreateModel(const char* config_path, c_OgaModel** out)
    void OgaDestroyModel(c_OgaModel* model)
    c_OgaResult* OgaCreateConfig(const char* config_path, c_OgaConfig** out)
    void OgaDestroyConfig(c_OgaConfig* config)
    c_OgaResult* OgaConfigOverlay(c_OgaConfig* config, const char* json)
    c_OgaResult* OgaConfigClearProviders(c_OgaConfig* config)
    c_OgaResult* OgaConfigAppendProvider(c_OgaConfig* config, const char* provider)
    c_OgaResult* OgaConfigSetProviderOption(c_OgaConfig* config, const char* provider, const char* key,
                                            const char* value)
    c_OgaResult* OgaCreateModelFromConfig(const c_OgaConfig* config, c_OgaModel** out)
    c_OgaResult* OgaCreateGeneratorParams(const c_OgaModel* model, c_OgaGeneratorParams** out)
    void OgaDestroyGeneratorParams(c_OgaGeneratorParams* params)
    c_OgaResult* OgaGeneratorParamsSetSearchNumber(c_OgaGeneratorParams* params, const char* name, double value)
    c_OgaResult* OgaGeneratorParamsSetSearchBool(c_OgaGeneratorParams* params, const char* name, cbool value)
    c_OgaResult* OgaGeneratorParamsGetSearchNumber(const c_OgaGeneratorParams* params, const char* name, double* out)
    c_OgaResult* OgaGeneratorParamsGetSearchBool(const c_OgaGeneratorParams* params, const char* name, cbool* out)
    c_OgaResult* OgaGeneratorParamsSetGuidance(c_OgaGeneratorParams* params, const char* type, const char* data,
                                               cbool enable_ff_tokens)
    c_OgaResult* OgaGeneratorParamsSetSpeculativeNumber(c_OgaGeneratorParams* params, const char* name, double value)
    c_OgaResult* OgaGeneratorParamsGetSpeculativeNumber(const c_OgaGeneratorParams* params, const char* name,
                                                        double* out)
    c_OgaResult* OgaGeneratorParamsSetSpeculativeBool(c_OgaGeneratorParams* params, const char* name, cbool value)
    c_OgaResult* OgaGeneratorParamsGetSpeculativeBool(const c_OgaGeneratorParams* params, const char* name,
                                                      cbool* out)

    # Generator
    c_OgaResult* OgaCreateGenerator(const c_OgaModel* model, const c_OgaGeneratorParams* params,
                                    c_OgaGenerator** out)
    void OgaDestroyGenerator(c_OgaGenerator* generator)
    cbool OgaGenerator_IsDone(c_OgaGenerator* generator)
    cbool OgaGenerator_IsSessionTerminated(const c_OgaGenerator* generator)
    c_OgaResult* OgaGenerator_SetRuntimeOption(c_OgaGenerator* generator, const char* key, const char* value)
    c_OgaResult* OgaGenerator_AppendTokens(c_OgaGenerator* generator, const int32_t* input_ids, size_t input_ids_count)
    c_OgaResult* OgaGenerator_AppendTokenSequences(c_OgaGenerator* generator, const c_OgaSequences* sequences)
    c_OgaResult* OgaGenerator_GenerateNextToken(c_OgaGenerator* generator)
    c_OgaResult* OgaGenerator_GetNextTokens(const c_OgaGenerator* generator, const int32_t** out, size_t* out_count)
    c_OgaResult* OgaGenerator_RewindTo(c_OgaGenerator* generator, size_t new_length)
    size_t OgaGenerator_TokenCount(const c_OgaGenerator* generator)
    size_t OgaGenerator_GetSequenceCount(const c_OgaGenerator* generator, size_t index)
    const int32_t* OgaGenerator_GetSequenceData(const c_OgaGenerator* generator, size_t index)
    c_OgaResult* OgaGenerator_GetLogits(c_OgaGenerator* generator, c_OgaTensor** out)
    c_OgaResult* OgaGenerator_SetLogits(c_OgaGenerator* generator, c_OgaTensor* tensor)
    c_OgaResult* OgaGenerator_GetSpeculativeStats(const c_OgaGenerator* generator, c_OgaSpeculativeStats** out)
    c_OgaResult* OgaGenerator_SetInputs(c_OgaGenerator* generator, const c_OgaNamedTensors* named_tensors)
    c_OgaResult* OgaGenerator_SetModelInput(c_OgaGenerator* generator, const char* name, c_OgaTensor* tensor)
    c_OgaResult* OgaGenerator_GetInput(const c_OgaGenerator* generator, const char* name, c_OgaTensor** out)
    c_OgaResult* OgaGenerator_GetOutput(const c_OgaGenerator* generator, const char* name, c_OgaTensor** out)
    c_OgaResult* OgaGenerator_SetHiddenStates(c_OgaGenerator* generator, c_OgaTensor* hidden_states)
    c_OgaResult* OgaGenerator_SnapshotState(c_OgaGenerator* generator)

    # The step API of onnxruntime-genai 0.10-0.15
    c_OgaResult* OgaCreateRequest(const c_OgaGeneratorParams* params, c_OgaRequest** out)
    c_OgaResult* OgaRequestAddTokens(c_OgaRequest* request, const c_OgaSequences* tokens)
    c_OgaResult* OgaRequestContinue(c_OgaRequest* request, const c_OgaSequences* tokens)
    c_OgaResult* OgaRequestHasUnseenTokens(const c_OgaRequest* request, cbool* out)
    c_OgaResult* OgaRequestGetUnseenToken(c_OgaRequest* request, int32_t* out)
    c_OgaResult* OgaRequestIsDone(const c_OgaRequest* request, cbool* out)
    c_OgaResult* OgaRequestIsTurnComplete(const c_OgaRequest* request, cbool* out)
    c_OgaResult* OgaRequestSetOpaqueData(c_OgaRequest* request, void* data)
    c_OgaResult* OgaRequestGetOpaqueData(c_OgaRequest* request, void** out)
    c_OgaResult* OgaEngineAddRequest(c_OgaEngine* engine, c_OgaRequest* request)
    c_OgaResult* OgaEngineRemoveRequest(c_OgaEngine* engine, c_OgaRequest* request)
    c_OgaResult* OgaEngineStep(c_OgaEngine* engine, c_OgaRequest** out)

    # Tensors
    c_OgaResult* OgaCreateTensorFromBuffer(void* data, const int64_t* shape_dims, size_t shape_dims_count,
                                           OgaElementType element_type, c_OgaTensor** out)
    c_OgaResult* OgaTensorGetType(c_OgaTensor* tensor, OgaElementType* out)
    c_OgaResult* OgaTensorGetShapeRank(c_OgaTensor* tensor, size_t* out)
    c_OgaResult* OgaTensorGetShape(c_OgaTensor* tensor, int64_t* shape_dims, size_t shape_dims_count)
    c_OgaResult* OgaTensorGetData(c_OgaTensor* tensor, void** out)
    void OgaDestroyTensor(c_OgaTensor* tensor)

    # Engine lifecycle
    c_OgaResult* OgaCreateEngine(c_OgaModel* model, c_OgaEngine** out)
    void OgaDestroyEngine(c_OgaEngine* engine)
    c_OgaResult* OgaEngineHasPendingRequests(c_OgaEngine* engine, cbool* out)
    c_OgaResult* OgaEngineMaxDraftTokensPerProposal(const c_OgaEngine* engine, size_t* out)
    c_OgaResult* OgaEngineGetCapabilities(const c_OgaEngine* engine, c_OgaEngineCapabilities** out)
    size_t OgaEngineCapabilitiesGetConfiguredMaxBatchSize(const c_OgaEngineCapabilities* capabilities)
    size_t OgaEngineCapabilitiesGetMaxScheduledTokens(const c_OgaEngineCapabilities* capabilities)
    uint64_t OgaEngineCapabilitiesGetMaxRequestLength(const c_OgaEngineCapabilities* capabilities)
    void OgaDestroyEngineCapabilities(c_OgaEngineCapabilities* capabilities)

    c_OgaResult* OgaEngineGetSpeculativeStats(const c_OgaEngine* engine, c_OgaSpeculativeStats** out)
    void OgaDestroySpeculativeStats(c_OgaSpeculativeStats* stats)
    c_OgaResult* OgaSpeculativeStatsGetCount(const c_OgaSpeculativeStats* stats, const char* name, uint64_t* value)
    c_OgaResult* OgaSpeculativeStatsGetNumber(const c_OgaSpeculativeStats* stats, const char* name, double* value)
    c_OgaResult* OgaSpeculativeStatsGetBool(const c_OgaSpeculativeStats* stats, const char* name, cbool* value)
    c_OgaResult* OgaSpeculativeStatsGetAcceptanceLengthHistogramSize(const c_OgaSpeculativeStats* stats, size_t* out)
    c_OgaResult* OgaSpeculativeStatsGetAcceptanceLengthCount(const c_OgaSpeculativeStats* stats, size_t length, uint64_t* out)

    # Request options
    c_OgaResult* OgaCreateRequestOptions(c_OgaRequestOptions** out)
    void OgaDestroyRequestOptions(c_OgaRequestOptions* options)
    c_OgaResult* OgaRequestOptionsSetMaxSessionTokens(c_OgaRequestOptions* options, uint64_t max_session_tokens)

    # Requests
    c_OgaResult* OgaEngineCreateRequest(c_OgaEngine* engine, const c_OgaRequestOptions* request_options, c_OgaRequest** out)
    c_OgaResult* OgaRequestBeginTurn(c_OgaRequest* request, const c_OgaTurnOptions* turn_options,
                                   const int32_t* input_ids, uint64_t input_ids_count, uint64_t* out_turn_id)
    c_OgaResult* OgaRequestCancelTurn(c_OgaRequest* request, uint64_t turn_id, cbool* out_cancelled)
    c_OgaResult* OgaRequestRewindToStartOfTurn(c_OgaRequest* request, uint64_t turn_id)
    c_OgaResult* OgaRequestClose(c_OgaRequest* request)
    c_OgaResult* OgaRequestSetDraftTokens(c_OgaRequest* request, const c_OgaSequences* tokens)
    void OgaDestroyRequest(c_OgaRequest* request)

    # Turn options
    c_OgaResult* OgaRequestCreateTurnOptions(c_OgaRequest* request, c_OgaTurnOptions** out)
    void OgaDestroyTurnOptions(c_OgaTurnOptions* options)
    c_OgaResult* OgaTurnOptionsSetMaxGeneratedTokens(c_OgaTurnOptions* options, uint64_t max_generated_tokens)
    c_OgaResult* OgaTurnOptionsSetMinGeneratedTokens(c_OgaTurnOptions* options, uint64_t min_generated_tokens)
    c_OgaResult* OgaTurnOptionsSetDoSample(c_OgaTurnOptions* options, cbool do_sample)
    c_OgaResult* OgaTurnOptionsSetTemperature(c_OgaTurnOptions* options, float temperature)
    c_OgaResult* OgaTurnOptionsSetTopP(c_OgaTurnOptions* options, float top_p)
    c_OgaResult* OgaTurnOptionsSetTopK(c_OgaTurnOptions* options, int32_t top_k)
    c_OgaResult* OgaTurnOptionsSetRepetitionPenalty(c_OgaTurnOptions* options, float repetition_penalty)
    c_OgaResult* OgaTurnOptionsSetNoRepeatNgramSize(c_OgaTurnOptions* options, int32_t no_repeat_ngram_size)
    c_OgaResult* OgaTurnOptionsSetSeed(c_OgaTurnOptions* options, uint64_t seed)
    c_OgaResult* OgaTurnOptionsClearSeed(c_OgaTurnOptions* options)
    c_OgaResult* OgaTurnOptionsSetStopStrings(c_OgaTurnOptions* options, const c_OgaStringArray* stop_strings)
    c_OgaResult* OgaTurnOptionsSetGuidance(c_OgaTurnOptions* options, const char* guidance_type, const char* guidance_data)
    c_OgaResult* OgaTurnOptionsSetDelimitedGuidance(c_OgaTurnOptions* options, int32_t opening_token,
                                                  int32_t closing_token, const char* grammar)
    c_OgaResult* OgaTurnOptionsClearGuidance(c_OgaTurnOptions* options)
    c_OgaResult* OgaTurnOptionsReset(c_OgaTurnOptions* options)

    # Event buffers, Run, events, usage
    c_OgaResult* OgaCreateEngineEventBuffer(c_OgaEngine* engine, size_t capacity, c_OgaEngineEventBuffer** out)
    void OgaDestroyEngineEventBuffer(c_OgaEngineEventBuffer* buffer)
    c_OgaResult* OgaEngineRun(c_OgaEngine* engine, c_OgaEngineEventBuffer* buffer)
    size_t OgaEngineEventBufferGetCount(const c_OgaEngineEventBuffer* buffer)
    const c_OgaEngineEvent* OgaEngineEventBufferGet(const c_OgaEngineEventBuffer* buffer, size_t index)

    c_OgaResult* OgaEngineEventGetFlags(const c_OgaEngineEvent* event, OgaEngineEventFlags* out)
    c_OgaResult* OgaEngineEventGetRequest(const c_OgaEngineEvent* event, const c_OgaRequest** out)
    c_OgaResult* OgaEngineEventGetTurnId(const c_OgaEngineEvent* event, uint64_t* out)
    c_OgaResult* OgaEngineEventGetToken(const c_OgaEngineEvent* event, int32_t* out)
    c_OgaResult* OgaEngineEventGetFinishReason(const c_OgaEngineEvent* event, OgaFinishReason* out)
    c_OgaResult* OgaEngineEventGetMatchedStopStringIndex(const c_OgaEngineEvent* event, int32_t* out)
    c_OgaResult* OgaEngineEventGetErrorCode(const c_OgaEngineEvent* event, OgaErrorCode* out)
    c_OgaResult* OgaEngineEventGetUsage(const c_OgaEngineEvent* event, const c_OgaTurnUsage** out)
    c_OgaResult* OgaTurnUsageGetPromptTokens(const c_OgaTurnUsage* usage, uint64_t* out)
    c_OgaResult* OgaTurnUsageGetGeneratedTokens(const c_OgaTurnUsage* usage, uint64_t* out)
    c_OgaResult* OgaTurnUsageGetCachedPromptTokens(const c_OgaTurnUsage* usage, uint64_t* out)

    # String arrays and sequences
    c_OgaResult* OgaCreateStringArray(c_OgaStringArray** out)
    c_OgaResult* OgaCreateStringArrayFromStrings(const char* const* strs, size_t count, c_OgaStringArray** out)
    c_OgaResult* OgaStringArrayAddString(c_OgaStringArray* string_array, const char* str)
    c_OgaResult* OgaStringArrayGetCount(const c_OgaStringArray* string_array, size_t* out)
    c_OgaResult* OgaStringArrayGetString(const c_OgaStringArray* string_array, size_t index, const char** out)
    void OgaDestroyStringArray(c_OgaStringArray* string_array)

    c_OgaResult* OgaCreateSequences(c_OgaSequences** out)
    c_OgaResult* OgaAppendTokenSequence(const int32_t* token_ptr, size_t token_cnt, c_OgaSequences* sequences)
    size_t OgaSequencesCount(const c_OgaSequences* sequences)
    size_t OgaSequencesGetSequenceCount(const c_OgaSequences* sequences, size_t sequence_index)
    const int32_t* OgaSequencesGetSequenceData(const c_OgaSequences* sequences, size_t sequence_index)
    void OgaDestroySequences(c_OgaSequences* sequences)


cdef extern from "oga/oga_ext.h" nogil:
    ctypedef uint32_t OgaExtErrorKind
    enum:
        OgaExtErrorKind_None
        OgaExtErrorKind_Api
        OgaExtErrorKind_Contract
        OgaExtErrorKind_Retryable
        OgaExtErrorKind_Device
        OgaExtErrorKind_Interrupted
        OgaExtErrorKind_OutOfMemory
        OgaExtErrorKind_Internal
    OgaExtErrorKind OgaExtResultGetErrorKind(const c_OgaResult* result)
    ctypedef uint32_t OgaExtExecutionStatus
    enum:
        OgaExtExecutionStatus_Ok
        OgaExtExecutionStatus_Retryable
        OgaExtExecutionStatus_CapacityExceeded
        OgaExtExecutionStatus_Fatal
        OgaExtExecutionStatus_Interrupted
        OgaExtLogitsType_Float32
        OgaExtLogitsType_Float16
        OgaExtStateGroupKind_PagedKv
        OgaExtStateGroupKind_FixedConv
        OgaExtStateGroupKind_FixedRecurrent
        OgaExtFaultPhase_Plan
        OgaExtFaultPhase_Reserve
        OgaExtFaultPhase_Execute
        OgaExtFaultPhase_Sample
        OgaExtFaultPhase_CommitPrepare
        OgaExtFaultPhase_Commit
        OgaExtFaultPhase_FixedStatePrepare
        OgaExtFaultPhase_DeviceCopy
        OgaExtFaultPhase_DeviceSample
    size_t OgaExtTokenize_Interrupted
    ctypedef uint32_t OgaExtLogitsType
    ctypedef uint32_t OgaExtFaultPhase

    ctypedef struct OgaExtEngineGeometry:
        size_t block_size
        size_t num_blocks
        size_t max_batch_size
        size_t max_scheduled_tokens
        size_t max_block_table_columns
        size_t vocab_size
        size_t max_sequence_length
        size_t window_ring_blocks
        size_t window_blocks
        size_t fixed_state_slots

    ctypedef struct OgaExtStaticStepInputs:
        size_t batch_size
        size_t sequence_length
        size_t total_sequence_length
        const int64_t* input_ids
        const int64_t* attention_mask
        const int32_t* logits_positions
        const int64_t* position_ids
        int32_t new_batch

    ctypedef struct OgaExtStepInputs:
        size_t num_rows
        size_t num_tokens
        const int64_t* input_ids
        const int64_t* position_ids
        const int32_t* cumulative_sequence_lengths
        const int32_t* past_sequence_lengths
        const int32_t* block_table
        size_t block_table_columns
        const int32_t* attention_metadata
        const int32_t* logits_indices
        int32_t graph_eligible
        const int32_t* block_table_windowed
        size_t num_fixed_states
        const void* const* fixed_state_inputs
        void* const* fixed_state_outputs
        void* const* fixed_state_captures
        int32_t fixed_state_direct
        int64_t graph_id

    ctypedef struct OgaExtStepOutputs:
        const void* logits
        OgaExtLogitsType logits_type
        size_t logits_rows
        size_t logits_row_stride
        int32_t logits_on_device
        const float* logits_block_maxima
        size_t logits_block_maxima_stride

    ctypedef struct OgaExtDeviceSampling:
        size_t num_rows
        const void* logits
        OgaExtLogitsType logits_type
        size_t logits_row_stride
        size_t vocab_size
        const int32_t* logits_rows
        const float* temperatures
        const int32_t* top_ks
        const float* top_ps
        const uint64_t* seeds
        const uint64_t* counters
        const int32_t* mask_eos
        const int32_t* eos_ids
        size_t num_eos
        const float* repetition_penalties
        const int64_t* history_offsets
        const int32_t* history_tokens
        int32_t* tokens

    ctypedef struct OgaExtDeviceOps:
        void* context
        void* (*allocate)(void* context, size_t nbytes)
        void (*release)(void* context, void* memory)
        int32_t (*copy)(void* context, size_t count, const void* const* sources, void* const* destinations,
                        size_t nbytes, char* message, size_t message_capacity)
        int32_t (*fill_zero)(void* context, void* memory, size_t nbytes, char* message, size_t message_capacity)
        int32_t (*synchronize)(void* context, char* message, size_t message_capacity)
        int32_t (*read)(void* context, size_t count, const void* const* sources, void* const* destinations,
                        size_t nbytes, char* message, size_t message_capacity)
        int32_t (*sample)(void* context, const OgaExtDeviceSampling* sampling, char* message,
                          size_t message_capacity)
        int32_t (*memory_info)(void* context, size_t* free_bytes, size_t* total_bytes, char* message,
                               size_t message_capacity)

    ctypedef struct OgaExtModelExecutor:
        int32_t per_token_logits
        size_t max_block_table_columns
        size_t bytes_per_block
        void* model_data
        OgaExtExecutionStatus (*open_engine)(void* model_data, const OgaExtEngineGeometry* geometry,
                                             void** engine_data, char* message, size_t message_capacity)
        OgaExtExecutionStatus (*execute)(void* engine_data, const OgaExtStepInputs* inputs,
                                         OgaExtStepOutputs* outputs, char* message, size_t message_capacity)
        void (*close_engine)(void* engine_data)
        void (*release_model)(void* model_data)
        OgaExtExecutionStatus (*execute_static)(void* engine_data, const OgaExtStaticStepInputs* inputs,
                                                OgaExtStepOutputs* outputs, char* message, size_t message_capacity)
        int32_t windowed_block_table
        size_t bytes_per_window_block
        size_t num_fixed_states
        const size_t* fixed_state_row_bytes
        int32_t fixed_state_capture
        int32_t cuda_graph
        const OgaExtDeviceOps* device_ops

    ctypedef uint32_t OgaExtStateGroupKind
    ctypedef struct OgaExtFixedStateNames:
        OgaExtStateGroupKind kind
        int32_t layer_id
        const char* input
        const char* output
    ctypedef struct OgaExtDecoderNames:
        const char* model_directory
        const char* config_json
        const char* decoder_filename
        const char* input_ids
        const char* position_ids
        const char* cumulative_sequence_lengths
        const char* past_sequence_lengths
        const char* block_table
        const char* block_table_windowed
        const char* attention_metadata
        const char* attention_mask
        const char* logits_indices
        const char* logits
        size_t num_paged_layers
        const int32_t* paged_layer_ids
        const char* const* past_key_names
        const char* const* past_value_names
        const char* const* present_key_names
        const char* const* present_value_names
        size_t block_size
        size_t vocab_size
        size_t num_fixed_states
        const OgaExtFixedStateNames* fixed_states
        size_t num_sliding_window_layers
        const int32_t* sliding_window_layers
        size_t num_key_value_heads
        size_t head_size
        size_t num_hidden_layers
        size_t num_blocks
        const char* session_options_json
    c_OgaResult* OgaExtConfigGetDecoderNames(const c_OgaConfig* config, const OgaExtDecoderNames** out)
    c_OgaResult* OgaExtConfigGetJson(const c_OgaConfig* config, const char** out)

    ctypedef OgaExtExecutionStatus (*OgaExtModelLoader)(const OgaExtDecoderNames* names, OgaExtModelExecutor* executor,
                                                        char* message, size_t message_capacity)
    void OgaExtSetModelLoader(OgaExtModelLoader loader)

    c_OgaResult* OgaExtCreateModelWithExecutor(const char* config_json, const OgaExtModelExecutor* executor,
                                             c_OgaModel** out)
    ctypedef struct OgaExtTokenTable:
        size_t count
        const uint8_t* bytes
        const size_t* offsets
        const uint8_t* special
    ctypedef OgaExtExecutionStatus (*OgaExtTokenTableLoader)(const char* model_directory, OgaExtTokenTable* table,
                                                             char* message, size_t message_capacity)
    void OgaExtSetTokenTableLoader(OgaExtTokenTableLoader loader)
    c_OgaResult* OgaExtModelSetTokenTable(c_OgaModel* model, const OgaExtTokenTable* table)
    c_OgaResult* OgaExtSetGuidanceLibrary(const char* path)
    ctypedef size_t (*OgaExtTokenizeFunction)(const char* model_directory, const uint8_t* bytes, size_t count,
                                              uint32_t* tokens, size_t capacity)
    void OgaExtSetTokenizeFunction(OgaExtTokenizeFunction tokenize)

    c_OgaResult* OgaExtCreateTestModel(const char* config_json, c_OgaModel** out)
    c_OgaResult* OgaExtTestModelInjectFault(c_OgaModel* model, OgaExtFaultPhase phase, OgaExtExecutionStatus kind,
                                          uint64_t skip, uint64_t count)

    c_OgaResult* OgaExtGeneratorIsDone(c_OgaGenerator* generator, cbool* out)
    c_OgaResult* OgaExtGeneratorParamsSetSearchOptions(c_OgaGeneratorParams* params, size_t count,
                                                       const char* const* names, const double* numbers,
                                                       const int32_t* is_bool)
    c_OgaResult* OgaExtEngineRequeueEvents(c_OgaEngine* engine, c_OgaEngineEventBuffer* buffer)
    c_OgaResult* OgaExtEngineCreateRequestWithParams(c_OgaEngine* engine, const c_OgaGeneratorParams* params,
                                                   const c_OgaRequestOptions* request_options, c_OgaRequest** out)

    void OgaExtRequestSetUserData(c_OgaRequest* request, void* user_data)
    void* OgaExtRequestGetUserData(const c_OgaRequest* request)
    uint64_t OgaExtEngineEventBufferGetGeneration(const c_OgaEngineEventBuffer* buffer)
    size_t OgaExtEngineEventBufferGetCapacity(const c_OgaEngineEventBuffer* buffer)
    const char* OgaExtLibraryPath()
    void OgaExtPhilox4x32_10(uint64_t counter, uint64_t key, uint32_t* out)

    c_OgaResult* OgaExtEngineCheckInvariants(const c_OgaEngine* engine)

    ctypedef struct OgaExtEngineCounters:
        uint64_t model_runs
        uint64_t committed_steps
        uint64_t rolled_back_steps
        uint64_t step_ns
        uint64_t executor_ns
        uint64_t total_blocks
        uint64_t free_blocks
        uint64_t resident_requests
        uint64_t waiting_requests
        uint64_t bound_requests
        uint64_t retained_events
        uint64_t fixed_state_direct_steps
        uint64_t fixed_state_fallback_steps
        uint64_t device_sampled_rows
        uint64_t host_read_logits_rows
        uint64_t preemptions
        uint64_t recomputed_tokens

    ctypedef struct OgaExtFixedStateSlot:
        int32_t slot
        uint32_t active_bank
        uint64_t allocation_generation
        uint64_t state_generation
        uint64_t committed_tokens

    c_OgaResult* OgaExtRequestGetFixedStateSlot(const c_OgaRequest* request, OgaExtFixedStateSlot* out)
    c_OgaResult* OgaExtRequestGetFixedStateRow(const c_OgaRequest* request, size_t tensor, const void** data,
                                               size_t* size)
    c_OgaResult* OgaExtEngineSetFixedStateFallbackOnly(c_OgaEngine* engine, int32_t fallback_only)

    c_OgaResult* OgaExtEngineGetCounters(const c_OgaEngine* engine, OgaExtEngineCounters* out)
    c_OgaResult* OgaExtEngineGetLastStepInputs(const c_OgaEngine* engine, OgaExtStepInputs* out)
    c_OgaResult* OgaExtRequestSetLastTurnIdForTesting(c_OgaRequest* request, uint64_t turn_id)


# Extension types (attributes visible to other Cython modules, e.g. a future executor module).

cdef class OgaConfig:
    cdef c_OgaConfig* _ptr
    cdef readonly object path
    cdef int _alive(self) except -1

cdef class OgaModel:
    cdef c_OgaModel* _ptr
    cdef readonly object path

cdef class OgaGeneratorParams:
    cdef c_OgaGeneratorParams* _ptr

cdef class OgaEngine:
    cdef c_OgaEngine* _ptr
    cdef dict _compat_buffers
    cdef dict _step_requests

cdef class OgaGenerator:
    cdef c_OgaGenerator* _ptr
    cdef size_t _batch_size  # rows a 2-D append_tokens block must have
    cdef int _alive(self) except -1

cdef class OgaRequest:
    cdef c_OgaRequest* _ptr
    cdef object _opaque

cdef class OgaRequestOptions:
    cdef c_OgaRequestOptions* _ptr

cdef class OgaTurnOptions:
    cdef c_OgaTurnOptions* _ptr
    cdef int _alive(self) except -1

cdef class OgaEngineEventBuffer:
    cdef c_OgaEngineEventBuffer* _ptr

cdef class OgaEngineEvent:
    cdef OgaEngineEventBuffer _buffer
    cdef const c_OgaEngineEventBuffer* _buf
    cdef const c_OgaEngineEvent* _ev
    cdef uint64_t _generation
    cdef size_t _index

cdef class OgaTurnUsage:
    cdef OgaEngineEventBuffer _buffer
    cdef const c_OgaEngineEventBuffer* _buf
    cdef const c_OgaTurnUsage* _usage
    cdef uint64_t _generation

cdef class OgaEngineCapabilities:
    cdef readonly size_t configured_max_batch_size
    cdef readonly size_t max_scheduled_tokens
    cdef readonly uint64_t max_request_length
