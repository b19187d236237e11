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
# SystemExit, GeneratorExit), or any exception the caller's own signal handler raised, raised by
# Python code inside a callback the core runs is not a failure of the model or the device: the
# caller wants control back. The trampoline keeps it in this thread's slot and reports
# OgaExtExecutionStatus_Interrupted (or the callback's plain failure where the core has no such
# status), so the core rolls back without effect and stays healthy; the Python wrapper of the core
# call raises it once the call returns. Exceptions keep their classification.
# ---------------------------------------------------------------------------------------------

cdef object _interruptions = threading.local()  # .error: this thread's deferred interruption
cdef Py_ssize_t _interrupted_threads = 0        # threads whose slot holds one (GIL-protected)


def _raised_by_signal_handler(error):
    """Whether `error` came out of a Python signal handler installed in this process (a RuntimeError
    from a SIGALRM timeout handler, say): the handler ran inside a callback only because the signal
    arrived while the callback held the main thread, so the exception is the caller's, not a failure
    of the model. Its traceback then passes through the handler's code, which the traceback of an
    exception raised by the callback's own code never does. Signal handlers run only on the main
    thread; only failure paths call this."""
    if threading.current_thread() is not threading.main_thread():
        return False
    traceback = getattr(error, "__traceback__", None)
    if traceback is None:
        return False
    codes = set()
    for signum in signal.valid_signals():
        try:
            code = _handler_code(signal.getsignal(signum))
        except (ValueError, OSError):
            continue
        if code is not None:
            codes.add(code)
    while traceback is not None:
        if traceback.tb_frame.f_code in codes:
            return True
        traceback = traceback.tb_next
    return False


cdef object _handler_code(object handler):
    """The code object a Python signal handler runs (a function, a bound method, a partial of
    either, or an object whose class defines __call__); None for SIG_DFL, SIG_IGN, None and
    built-in handlers (signal.default_int_handler raises KeyboardInterrupt, an interruption anyway)."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    function = getattr(handler, "__func__", handler)
    code = getattr(function, "__code__", None)
    if code is None and not isinstance(handler, (int, type(None))):
        call = getattr(type(handler), "__call__", None)
        code = getattr(call, "__code__", None)
    return code


cdef void _defer_interruption(object error) noexcept:
    """Keeps `error` for the wrapper of the running core call (the first one of a call wins)."""
    global _interrupted_threads
    try:
        if getattr(_interruptions, "error", None) is None:
            _interruptions.error = error
            _interrupted_threads += 1
    except BaseException:
        pass


cdef bint _is_interruption(object error) noexcept:
    if not isinstance(error, Exception):
        return True
    try:
        return _raised_by_signal_handler(error)
    except BaseException as late:
        # A signal handler raised while the check ran: an interruption of its own, which wins.
        _defer_interruption(late)
        return True


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
