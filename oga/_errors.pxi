# Part of oga/_core.pyx (included there; compiled as one module).

# ---------------------------------------------------------------------------------------------
# Error translation
# ---------------------------------------------------------------------------------------------

class ErrorKind(enum.IntEnum):
    """OgaExtErrorKind: the core's error type behind a failed call (include/oga/oga_ext.h)."""
    NONE = OgaExtErrorKind_None
    API = OgaExtErrorKind_Api
    CONTRACT = OgaExtErrorKind_Contract
    RETRYABLE = OgaExtErrorKind_Retryable
    DEVICE = OgaExtErrorKind_Device
    INTERRUPTED = OgaExtErrorKind_Interrupted
    OUT_OF_MEMORY = OgaExtErrorKind_OutOfMemory
    INTERNAL = OgaExtErrorKind_Internal


class OgaError(RuntimeError):
    """A failed core call: the C API's message, and `kind` (ErrorKind), the core's error type. A
    RuntimeError, as onnxruntime-genai's errors are, so code that catches those keeps working."""

    kind = ErrorKind.API

    def __init__(self, message, kind=ErrorKind.API):
        super().__init__(message)
        self.kind = kind


cdef int _raise_result(c_OgaResult* result) except -1:
    cdef const char* message = OgaResultGetError(result)
    cdef OgaExtErrorKind kind = OgaExtResultGetErrorKind(result)
    text = message.decode("utf-8", "replace") if message != NULL else "oga: unknown error."
    OgaDestroyResult(result)
    raise OgaError(text, ErrorKind(kind) if kind <= OgaExtErrorKind_Internal else ErrorKind.INTERNAL)


cdef inline int check_result(c_OgaResult* result) except -1:
    """Raises OgaError(<C message>, kind) and destroys `result` when it is not NULL."""
    if result != NULL:
        return _raise_result(result)
    return 0


# ---------------------------------------------------------------------------------------------
# Interruptions. A BaseException that is not an Exception (KeyboardInterrupt from a signal handler,
# SystemExit, GeneratorExit) raised by Python code inside a callback the core runs is not a failure
# of the model or the device: the caller wants control back. The trampoline keeps it in this
# thread's slot and reports OgaExtExecutionStatus_Interrupted (or the callback's plain failure where
# the core has no such status), so the core rolls back without effect and stays healthy; the Python
# wrapper of the core call raises it once the call returns. Exceptions keep their classification.
# ---------------------------------------------------------------------------------------------

cdef object _interruptions = threading.local()  # .error: this thread's deferred interruption
cdef Py_ssize_t _interrupted_threads = 0        # threads whose slot holds one (GIL-protected)


cdef inline bint _is_interruption(object error):
    return not isinstance(error, Exception)


cdef void _defer_interruption(object error) noexcept:
    """Keeps `error` for the wrapper of the running core call (the first one of a call wins)."""
    global _interrupted_threads
    try:
        if getattr(_interruptions, "error", None) is None:
            _interruptions.error = error
            _interrupted_threads += 1
    except BaseException:
        pass


cdef bint _interruption_deferred() noexcept:
    """Whether this thread's slot holds an interruption."""
    if _interrupted_threads == 0:
        return False
    try:
        return getattr(_interruptions, "error", None) is not None
    except BaseException:
        return False


cdef int _raise_interruption() except -1:
    """Raises (and clears) this thread's deferred interruption, if any."""
    global _interrupted_threads
    if _interrupted_threads == 0:
        return 0
    error = getattr(_interruptions, "error", None)
    if error is None:
        return 0
    _interruptions.error = None
    _interrupted_threads -= 1
    raise error


cdef int _check_callbacks(c_OgaResult* result) except -1:
    """check_result for a core call that can run Python callbacks: an interruption a callback
    deferred is raised instead of the call's own error (`result` is destroyed either way)."""
    if _interrupted_threads != 0:
        try:
            _raise_interruption()
        except BaseException:
            if result != NULL:
                OgaDestroyResult(result)
            raise
    return check_result(result)


cdef int _raise_dead(str what) except -1:
    raise RuntimeError(
        f"This {what} has no native handle: it was not created by oga or its initialisation failed.")


cdef inline int _check_fresh(const c_OgaEngineEventBuffer* buffer, uint64_t generation) except -1:
    if OgaExtEngineEventBufferGetGeneration(buffer) != generation:
        raise RuntimeError(_STALE_MESSAGE)
    return 0
