# Part of oga/_core.pyx (included there; compiled as one module).

# ---------------------------------------------------------------------------------------------
# Enums, their values the C constants of include/oga/oga.h and oga_ext.h (declared in _core.pxd).
# ---------------------------------------------------------------------------------------------

class EngineEventFlags(enum.IntFlag):
    """OgaEngineEventFlags: a bitmask; test bits, never compare for equality."""
    NONE = OgaEngineEventFlag_None
    TOKEN = OgaEngineEventFlag_Token
    TURN_FINISHED = OgaEngineEventFlag_TurnFinished
    CAPACITY_BLOCKED = OgaEngineEventFlag_CapacityBlocked
    FAILED = OgaEngineEventFlag_Failed
    RETRYABLE = OgaEngineEventFlag_Retryable


class FinishReason(enum.IntEnum):
    """OgaFinishReason."""
    NONE = OgaFinishReason_None
    EOS = OgaFinishReason_Eos
    STOP_STRING = OgaFinishReason_StopString
    MAX_GENERATED_TOKENS = OgaFinishReason_MaxGeneratedTokens
    MAX_SESSION_TOKENS = OgaFinishReason_MaxSessionTokens
    CANCELLED = OgaFinishReason_Cancelled
    FAILED = OgaFinishReason_Failed


class EngineErrorCode(enum.IntEnum):
    """OgaErrorCode."""
    NONE = OgaErrorCode_None
    CAPACITY_DEFERRED = OgaErrorCode_CapacityDeferred
    EXECUTION_CAPACITY_EXCEEDED = OgaErrorCode_ExecutionCapacityExceeded
    RETRYABLE_EXECUTION = OgaErrorCode_RetryableExecution
    REQUEST_UNSERVICEABLE = OgaErrorCode_RequestUnserviceable
    ENGINE_CONTRACT_FAILURE = OgaErrorCode_EngineContractFailure
    ENGINE_EXECUTION_FAILURE = OgaErrorCode_EngineExecutionFailure


# The executor interface's codes (oga_ext.h), for oga.executor and oga.testing.
class ExecutionStatus(enum.IntEnum):
    """OgaExtExecutionStatus: what an executor callback returns."""
    OK = OgaExtExecutionStatus_Ok
    RETRYABLE = OgaExtExecutionStatus_Retryable
    CAPACITY_EXCEEDED = OgaExtExecutionStatus_CapacityExceeded
    FATAL = OgaExtExecutionStatus_Fatal
    INTERRUPTED = OgaExtExecutionStatus_Interrupted


class LogitsType(enum.IntEnum):
    """OgaExtLogitsType."""
    FLOAT32 = OgaExtLogitsType_Float32
    FLOAT16 = OgaExtLogitsType_Float16


class FaultPhase(enum.IntEnum):
    """OgaExtFaultPhase: where the test model's fault injector is consulted."""
    PLAN = OgaExtFaultPhase_Plan
    RESERVE = OgaExtFaultPhase_Reserve
    EXECUTE = OgaExtFaultPhase_Execute
    SAMPLE = OgaExtFaultPhase_Sample
    COMMIT_PREPARE = OgaExtFaultPhase_CommitPrepare
    COMMIT = OgaExtFaultPhase_Commit
    FIXED_STATE_PREPARE = OgaExtFaultPhase_FixedStatePrepare
    DEVICE_COPY = OgaExtFaultPhase_DeviceCopy
    DEVICE_SAMPLE = OgaExtFaultPhase_DeviceSample


# Getters return members from these tuples, indexed by the C value, so no member is built per call.
cdef tuple _FLAGS = tuple(EngineEventFlags(i) for i in range(OgaEngineEventFlag_Retryable << 1))  # every combination
cdef tuple _FINISH_REASONS = tuple(FinishReason(i) for i in range(len(FinishReason)))
cdef tuple _ERROR_CODES = tuple(EngineErrorCode(i) for i in range(len(EngineErrorCode)))

cdef enum:
    _SMALL_TOKENS = 256  # token lists up to this length are converted on the stack

cdef str _STALE_MESSAGE = (
    "This EngineEvent view is stale: its EngineEventBuffer was run again. "
    "Copy event values out before the next Engine.run.")
cdef str _NO_CONSTRUCTOR = "No constructor defined!"
