# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
# cython: embedsignature=True
"""oga._core: extension types over the oga C API (include/oga/oga.h, include/oga/oga_ext.h).

Every public method converts its arguments, makes one C call and passes the returned OgaResult*
through check_result. Engine logic lives in the C++ core, never here.
"""

cimport cython
from cpython.buffer cimport PyBUF_READ, PyBUF_WRITE
from cpython.long cimport PyLong_AsLongLong, PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport INT32_MAX, INT32_MIN, int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.string cimport memcpy
from libcpp cimport bool as cbool

import enum
import json
import os
import threading

import numpy as np


# ---------------------------------------------------------------------------------------------
# Enums. Getters return members from precomputed tuples so no enum member is built per call.
# ---------------------------------------------------------------------------------------------

class EngineEventFlags(enum.IntFlag):
    """OgaEngineEventFlags: a bitmask; test bits, never compare for equality."""
    NONE = 0
    TOKEN = 1
    TURN_FINISHED = 2
    CAPACITY_BLOCKED = 4
    FAILED = 8
    RETRYABLE = 16


class FinishReason(enum.IntEnum):
    """OgaFinishReason."""
    NONE = 0
    EOS = 1
    STOP_STRING = 2
    MAX_GENERATED_TOKENS = 3
    MAX_SESSION_TOKENS = 4
    CANCELLED = 5
    FAILED = 6


class EngineErrorCode(enum.IntEnum):
    """OgaErrorCode."""
    NONE = 0
    CAPACITY_DEFERRED = 1
    EXECUTION_CAPACITY_EXCEEDED = 2
    RETRYABLE_EXECUTION = 3
    REQUEST_UNSERVICEABLE = 4
    ENGINE_CONTRACT_FAILURE = 5
    ENGINE_EXECUTION_FAILURE = 6


cdef tuple _FLAGS = tuple(EngineEventFlags(i) for i in range(32))
cdef tuple _FINISH_REASONS = tuple(FinishReason(i) for i in range(7))
cdef tuple _ERROR_CODES = tuple(EngineErrorCode(i) for i in range(7))

cdef enum:
    _FLAG_TOKEN = 1
    _FINISH_STOP_STRING = 2
    _SMALL_TOKENS = 256  # token lists up to this length are converted on the stack

cdef str _STALE_MESSAGE = (
    "This EngineEvent view is stale: its EngineEventBuffer was run again. "
    "Copy event values out before the next Engine.run.")
cdef str _NO_CONSTRUCTOR = "No constructor defined!"


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

cdef enum:
    _STATUS_INTERRUPTED = 4  # OgaExtExecutionStatus_Interrupted

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


# ---------------------------------------------------------------------------------------------
# Token conversion: any 1-D array-like of ints -> contiguous int32, out-of-range values rejected.
# ---------------------------------------------------------------------------------------------

cdef struct TokenSpan:
    const int32_t* data
    size_t count
    int32_t* heap  # PyMem allocation owned by the span (NULL when unused)


cdef int _raise_token_range(object value) except -1:
    raise ValueError(f"Token ids must be in the int32 range [{INT32_MIN}, {INT32_MAX}]; got {value}.")


cdef object _tokens_to_span(object tokens, TokenSpan* span, int32_t* small):
    """Fills `span`; returns an object that must stay alive while span.data is used."""
    cdef Py_ssize_t n, i
    cdef long long v = 0
    cdef int32_t* out
    span.data = NULL
    span.count = 0
    span.heap = NULL
    if type(tokens) is list or type(tokens) is tuple:
        n = len(tokens)
        out = small if n <= _SMALL_TOKENS else <int32_t*>PyMem_Malloc(n * sizeof(int32_t))
        if out == NULL:
            raise MemoryError()
        if out != small:
            span.heap = out
        for i in range(n):
            item = tokens[i]
            if not PyLong_CheckExact(item):
                break
            try:
                v = PyLong_AsLongLong(item)
            except OverflowError:
                v = <long long>INT32_MAX + 1
            if v < INT32_MIN or v > INT32_MAX:
                PyMem_Free(span.heap)
                span.heap = NULL
                _raise_token_range(item)
            out[i] = <int32_t>v
        else:
            span.data = out
            span.count = n
            return None
        # A non-int element: take the general (numpy) path.
        PyMem_Free(span.heap)
        span.heap = NULL
    arr = _tokens_to_int32_array(tokens)
    cdef const int32_t[::1] view = arr
    span.count = view.shape[0]
    span.data = &view[0] if span.count > 0 else NULL
    return view


cdef object _tokens_to_int32_array(object tokens):
    if tokens is None:
        raise TypeError("tokens must be a one-dimensional array-like of int32 token ids, not None.")
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError("tokens must be a one-dimensional array.")
    kind = arr.dtype.kind
    if arr.dtype == np.int32:
        return np.ascontiguousarray(arr)
    if kind == "O" and arr.size and all(type(v) is int for v in arr):
        try:
            arr = np.asarray(arr, dtype=np.int64)
        except OverflowError:
            raise ValueError(f"Token ids must be in the int32 range [{INT32_MIN}, {INT32_MAX}].") from None
        kind = "i"
    if kind not in "iu" and arr.size:
        # Floats, bools and strings are not token ids: converting them would silently truncate.
        raise TypeError(f"tokens must hold integer token ids, not {arr.dtype} values.")
    if arr.size:
        lo = arr.min()
        hi = arr.max()
        if lo < INT32_MIN:
            _raise_token_range(lo)
        if hi > INT32_MAX:
            _raise_token_range(hi)
    return np.ascontiguousarray(arr, dtype=np.int32)


cdef inline void _release_span(TokenSpan* span) noexcept:
    if span.heap != NULL:
        PyMem_Free(span.heap)
        span.heap = NULL


# ---------------------------------------------------------------------------------------------
# Models and generator params
# ---------------------------------------------------------------------------------------------

cdef object _model_directory(object config_path):
    """The directory of a model path, which may name genai_config.json itself."""
    path = os.fspath(config_path)
    return os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else os.path.abspath(path)


cdef class OgaConfig:
    """A model directory's configuration (OgaConfig*), to adjust before creating the model."""

    def __init__(self, config_path):
        """OgaCreateConfig."""
        cdef c_OgaConfig* config = NULL
        cdef c_OgaResult* result
        if self._ptr != NULL:
            raise RuntimeError("Config is already initialised.")
        encoded = os.fsencode(config_path)
        cdef const char* c_path = encoded
        with nogil:
            result = OgaCreateConfig(c_path, &config)
        check_result(result)
        self._ptr = config
        self.path = _model_directory(config_path)

    def __dealloc__(self):
        OgaDestroyConfig(self._ptr)
        self._ptr = NULL

    cdef int _alive(self) except -1:
        if self._ptr == NULL:
            _raise_dead("Config")
        return 0

    def overlay(self, str json):
        """OgaConfigOverlay: merges `json` into the configuration (validated before it is published)."""
        self._alive()
        check_result(OgaConfigOverlay(self._ptr, json.encode("utf-8")))

    def clear_providers(self):
        """OgaConfigClearProviders."""
        self._alive()
        check_result(OgaConfigClearProviders(self._ptr))

    def append_provider(self, str provider):
        """OgaConfigAppendProvider."""
        self._alive()
        check_result(OgaConfigAppendProvider(self._ptr, provider.encode("utf-8")))

    def set_provider_option(self, str provider, str key, str value):
        """OgaConfigSetProviderOption."""
        self._alive()
        check_result(OgaConfigSetProviderOption(self._ptr, provider.encode("utf-8"), key.encode("utf-8"),
                                                value.encode("utf-8")))


cdef class OgaModel:
    """A model: configuration plus executor (OgaModel*). `path` is its directory (None for models
    created without one, such as oga.testing test models)."""

    def __init__(self, config):
        """OgaCreateModel(path), or OgaCreateModelFromConfig(config) for a Config."""
        cdef c_OgaModel* model = NULL
        cdef c_OgaResult* result
        cdef const c_OgaConfig* c_config
        cdef const char* c_path
        if self._ptr != NULL:
            raise RuntimeError("Model is already initialised.")
        if isinstance(config, OgaConfig):
            c_config = (<OgaConfig>config)._ptr
            if c_config == NULL:
                _raise_dead("Config")
            with nogil:
                result = OgaCreateModelFromConfig(c_config, &model)
            if result == NULL:
                self._ptr = model  # released by __dealloc__ if an interruption is raised below
            _check_callbacks(result)
            self.path = (<OgaConfig>config).path
        else:
            encoded = os.fsencode(config)
            c_path = encoded
            with nogil:
                result = OgaCreateModel(c_path, &model)
            if result == NULL:
                self._ptr = model
            _check_callbacks(result)
            self.path = _model_directory(config)
        self._ptr = model

    def __dealloc__(self):
        OgaDestroyModel(self._ptr)
        self._ptr = NULL


cdef OgaModel _wrap_model(c_OgaModel* model):
    cdef OgaModel obj = OgaModel.__new__(OgaModel)
    obj._ptr = model
    return obj


cdef class OgaGeneratorParams:
    """Seed-era request defaults (OgaGeneratorParams*), used by Engine.create_request(params)."""

    def __init__(self, OgaModel model not None):
        """OgaCreateGeneratorParams."""
        cdef c_OgaGeneratorParams* params = NULL
        if self._ptr != NULL:
            raise RuntimeError("GeneratorParams is already initialised.")
        if model._ptr == NULL:
            _raise_dead("Model")
        check_result(OgaCreateGeneratorParams(model._ptr, &params))
        self._ptr = params

    def __dealloc__(self):
        OgaDestroyGeneratorParams(self._ptr)
        self._ptr = NULL

    def get_search_options(self):
        """Every search option (OgaGeneratorParamsGetSearchNumber / Bool) as a dict: numbers as
        float, bools as bool, keyed like onnxruntime-genai 0.18."""
        cdef double number
        cdef cbool flag
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        out = {}
        for name, is_bool in _SEARCH_OPTIONS:
            c_name = (<str>name).encode()
            if is_bool:
                check_result(OgaGeneratorParamsGetSearchBool(self._ptr, c_name, &flag))
                out[name] = flag
            else:
                check_result(OgaGeneratorParamsGetSearchNumber(self._ptr, c_name, &number))
                out[name] = number
        return out

    def set_guidance(self, str type, str data, bint enable_ff_tokens=False):
        """OgaGeneratorParamsSetGuidance: json_schema, regex or lark_grammar guidance for the
        whole generation (enable_ff_tokens=True is not supported by oga)."""
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        check_result(OgaGeneratorParamsSetGuidance(self._ptr, type.encode("utf-8"), data.encode("utf-8"),
                                                   enable_ff_tokens))

    def set_speculative_options(self, **options):
        """OgaGeneratorParamsSetSpeculativeNumber: not supported by oga (raises)."""
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        check_result(OgaGeneratorParamsSetSpeculativeNumber(self._ptr, b"", 0.0))

    def get_speculative_options(self):
        """OgaGeneratorParamsGetSpeculativeNumber: not supported by oga (raises)."""
        cdef double number
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        check_result(OgaGeneratorParamsGetSpeculativeNumber(self._ptr, b"", &number))

    def set_search_options(self, **options):
        """Bools -> OgaGeneratorParamsSetSearchBool; numbers -> OgaGeneratorParamsSetSearchNumber."""
        cdef double number
        if self._ptr == NULL:
            _raise_dead("GeneratorParams")
        for name, value in options.items():
            c_name = name.encode("utf-8")
            if isinstance(value, (bool, np.bool_)):
                check_result(OgaGeneratorParamsSetSearchBool(self._ptr, c_name, bool(value)))
            elif isinstance(value, (str, bytes)):
                raise TypeError(f"Search option {name} must be a number or a bool, not {type(value).__name__}.")
            else:
                try:
                    number = value
                except TypeError:
                    raise TypeError(
                        f"Search option {name} must be a number or a bool, not {type(value).__name__}.") from None
                check_result(OgaGeneratorParamsSetSearchNumber(self._ptr, c_name, number))


# 0.18's search option names (alphabetical, as get_search_options lists them) and whether each is a bool.
cdef tuple _SEARCH_OPTIONS = (
    ("batch_size", False), ("chunk_size", False), ("diversity_penalty", False), ("do_sample", True),
    ("early_stopping", True), ("length_penalty", False), ("max_length", False), ("min_length", False),
    ("no_repeat_ngram_size", False), ("num_beams", False), ("num_return_sequences", False),
    ("past_present_share_buffer", True), ("random_seed", False), ("repetition_penalty", False),
    ("temperature", False), ("top_k", False), ("top_p", False),
)


# ---------------------------------------------------------------------------------------------
# Engine
# ---------------------------------------------------------------------------------------------

cdef tuple _SPECULATIVE_COUNT_KEYS = (
    "rounds", "completed_rounds", "interrupted_rounds", "active_rounds", "draft_tokens_proposed",
    "draft_tokens_evaluated", "draft_tokens_accepted", "correction_tokens", "bonus_tokens",
    "tokens_queued", "tokens_emitted", "tokens_discarded", "tokens_buffered", "draft_forward_passes",
    "target_forward_passes", "effective_k", "adaptive_k_increases", "adaptive_k_decreases",
    "adaptive_k_observations", "adaptive_k_probes", "cooldown_entries", "cooldown_steps",
    "cooldown_remaining", "standard_fallback_steps", "mtp_failures", "dflash2_failures",
    "dflash2_disables", "dflash2_admission_misses", "full_accept_rounds", "partial_accept_rounds",
    "zero_accept_rounds", "target_verify_forward_passes", "target_reanchor_forward_passes",
    "target_reconciliation_forward_passes", "ngram_lookup_hits", "ngram_lookup_misses",
    "ngram_lookup_tokens_proposed", "ngram_chained_tokens_proposed",
    "ngram_grammar_candidate_rejections", "ngram_history_syncs", "ngram_history_tokens_synced",
)
cdef tuple _SPECULATIVE_BOOL_KEYS = ("formula_supported",)
cdef tuple _SPECULATIVE_NUMBER_KEYS = (
    "total_draft_ms", "total_target_ms", "total_reconciliation_ms", "total_target_verify_ms",
    "total_target_reanchor_ms", "total_ngram_history_sync_ms", "total_ngram_lookup_ms",
    "avg_draft_ms_per_token", "acceptance_rate", "avg_draft_tokens_per_round",
    "mean_emitted_tokens_per_round", "expected_tokens_per_round", "avg_target_ms_per_round",
    "target_baseline_ms_per_token", "target_overhead_ratio", "estimated_speedup", "observed_speedup",
    "adaptive_k_throughput",
)


cdef dict _speculative_stats_dict(c_OgaSpeculativeStats* stats):
    """Reads every key of an OgaSpeculativeStats snapshot into a dict, then destroys it."""
    cdef uint64_t count
    cdef double number
    cdef cbool flag
    cdef size_t size, i
    out = {}
    try:
        for key in _SPECULATIVE_COUNT_KEYS:
            check_result(OgaSpeculativeStatsGetCount(stats, (<str>key).encode(), &count))
            out[key] = count
        for key in _SPECULATIVE_BOOL_KEYS:
            check_result(OgaSpeculativeStatsGetBool(stats, (<str>key).encode(), &flag))
            out[key] = flag
        for key in _SPECULATIVE_NUMBER_KEYS:
            check_result(OgaSpeculativeStatsGetNumber(stats, (<str>key).encode(), &number))
            out[key] = number
        check_result(OgaSpeculativeStatsGetAcceptanceLengthHistogramSize(stats, &size))
        histogram = []
        for i in range(size):
            check_result(OgaSpeculativeStatsGetAcceptanceLengthCount(stats, i, &count))
            histogram.append(count)
        out["acceptance_length_histogram"] = histogram
    finally:
        OgaDestroySpeculativeStats(stats)
    return out


@cython.no_gc
cdef class OgaEngine:
    """A continuous-batching engine (OgaEngine*). The creating thread is its owner thread."""

    def __init__(self, OgaModel model not None):
        """OgaCreateEngine."""
        cdef c_OgaEngine* engine = NULL
        cdef c_OgaResult* result
        if self._ptr != NULL:
            raise RuntimeError("Engine is already initialised.")
        if model._ptr == NULL:
            _raise_dead("Model")
        self._compat_buffers = {}
        self._step_requests = {}
        with nogil:
            result = OgaCreateEngine(model._ptr, &engine)
        if result == NULL:
            self._ptr = engine  # released by __dealloc__ if an interruption is raised below
        _check_callbacks(result)

    def __dealloc__(self):
        # Destroy the engine before the cached run(max_events=N) buffers (fields are cleared after
        # __dealloc__); buffers are safe to destroy after their engine.
        OgaDestroyEngine(self._ptr)
        self._ptr = NULL

    def create_request(self, params=None, options=None):
        """Creates a Request: OgaEngineCreateRequest, or OgaExtEngineCreateRequestWithParams when
        the seed-era GeneratorParams `params` is given (positional form accepted)."""
        cdef c_OgaRequest* request = NULL
        cdef c_OgaRequestOptions* c_options = NULL
        cdef c_OgaGeneratorParams* c_params = NULL
        cdef c_OgaResult* result
        if self._ptr == NULL:
            _raise_dead("Engine")
        if options is not None:
            if not isinstance(options, OgaRequestOptions):
                raise TypeError(f"options must be a RequestOptions or None, not {type(options).__name__}.")
            c_options = (<OgaRequestOptions>options)._ptr
            if c_options == NULL:
                _raise_dead("RequestOptions")
        if params is None:
            with nogil:
                result = OgaEngineCreateRequest(self._ptr, c_options, &request)
        else:
            if not isinstance(params, OgaGeneratorParams):
                raise TypeError(f"params must be a GeneratorParams or None, not {type(params).__name__}.")
            c_params = (<OgaGeneratorParams>params)._ptr
            if c_params == NULL:
                _raise_dead("GeneratorParams")
            with nogil:
                result = OgaExtEngineCreateRequestWithParams(self._ptr, c_params, c_options, &request)
        check_result(result)
        return _wrap_request(request)

    def create_event_buffer(self, size_t capacity):
        """OgaCreateEngineEventBuffer: an event buffer with `capacity` slots, bound to this engine."""
        cdef c_OgaEngineEventBuffer* buffer = NULL
        if self._ptr == NULL:
            _raise_dead("Engine")
        check_result(OgaCreateEngineEventBuffer(self._ptr, capacity, &buffer))
        cdef OgaEngineEventBuffer obj = OgaEngineEventBuffer.__new__(OgaEngineEventBuffer)
        obj._ptr = buffer
        return obj

    def run(self, OgaEngineEventBuffer buffer=None, *, max_events=None):
        """OgaEngineRun (GIL released). run(buffer) returns `buffer`; the seed-era run(max_events=N)
        runs a cached internal buffer of capacity N and returns a list of its event views.
        A KeyboardInterrupt (any BaseException that is not an Exception) raised by Python code the
        step ran, such as the ONNX Runtime executor, is raised from here once the core returns: the
        step was rolled back, the engine is healthy, and the next run delivers its Retryable event."""
        cdef c_OgaResult* result
        if buffer is None or max_events is not None:
            return self._run_compat(buffer, max_events)
        if self._ptr == NULL:
            _raise_dead("Engine")
        if buffer._ptr == NULL:
            _raise_dead("EngineEventBuffer")
        with nogil:
            result = OgaEngineRun(self._ptr, buffer._ptr)
        if result != NULL or _interrupted_threads != 0:
            _check_callbacks(result)
        return buffer

    def _run_compat(self, buffer, max_events):
        if buffer is not None or max_events is None:
            raise TypeError("run() takes exactly one of buffer or max_events.")
        cdef size_t capacity = max_events
        cached = self._compat_buffers.get(capacity)
        if cached is None:
            cached = self.create_event_buffer(capacity)
            self._compat_buffers[capacity] = cached
        return list(self.run(cached))

    def has_pending_requests(self):
        """OgaEngineHasPendingRequests. The GIL stays held: the call never runs the model and takes
        well under a microsecond, less than releasing and retaking the GIL would cost."""
        cdef cbool pending = False
        if self._ptr == NULL:
            _raise_dead("Engine")
        check_result(OgaEngineHasPendingRequests(self._ptr, &pending))
        return pending

    def get_capabilities(self):
        """OgaEngineGetCapabilities: an immutable snapshot."""
        cdef c_OgaEngineCapabilities* caps = NULL
        if self._ptr == NULL:
            _raise_dead("Engine")
        check_result(OgaEngineGetCapabilities(self._ptr, &caps))
        cdef OgaEngineCapabilities obj = OgaEngineCapabilities.__new__(OgaEngineCapabilities)
        obj.configured_max_batch_size = OgaEngineCapabilitiesGetConfiguredMaxBatchSize(caps)
        obj.max_scheduled_tokens = OgaEngineCapabilitiesGetMaxScheduledTokens(caps)
        obj.max_request_length = OgaEngineCapabilitiesGetMaxRequestLength(caps)
        OgaDestroyEngineCapabilities(caps)
        return obj

    def get_speculative_stats(self):
        """OgaEngineGetSpeculativeStats, read into a dict (keys as in onnxruntime-genai 0.18)."""
        cdef c_OgaSpeculativeStats* stats = NULL
        if self._ptr == NULL:
            _raise_dead("Engine")
        check_result(OgaEngineGetSpeculativeStats(self._ptr, &stats))
        return _speculative_stats_dict(stats)

    # The step API of onnxruntime-genai 0.10-0.15 (og.Request(params)); see include/oga/oga.h.

    def add_request(self, OgaRequest request not None):
        """OgaEngineAddRequest (GIL released): any thread; from another thread the request is queued
        for the owner thread, which admits it at its next step() or has_pending_requests(). The
        engine keeps the request object until it is removed."""
        cdef c_OgaResult* result
        if self._ptr == NULL:
            _raise_dead("Engine")
        if request._ptr == NULL:
            _raise_dead("Request")
        with nogil:
            result = OgaEngineAddRequest(self._ptr, request._ptr)
        _check_callbacks(result)
        self._step_requests[id(request)] = request

    def remove_request(self, OgaRequest request not None):
        """OgaEngineRemoveRequest: stops the request and frees its cache (any thread)."""
        cdef c_OgaResult* result
        if self._ptr == NULL:
            _raise_dead("Engine")
        if request._ptr == NULL:
            _raise_dead("Request")
        with nogil:
            result = OgaEngineRemoveRequest(self._ptr, request._ptr)
        check_result(result)
        self._step_requests.pop(id(request), None)

    def step(self):
        """OgaEngineStep (GIL released): the next Request with unseen tokens, or None when idle."""
        cdef c_OgaRequest* ready = NULL
        cdef c_OgaResult* result
        cdef void* owner
        if self._ptr == NULL:
            _raise_dead("Engine")
        with nogil:
            result = OgaEngineStep(self._ptr, &ready)
        if result != NULL or _interrupted_threads != 0:
            _check_callbacks(result)
        if ready == NULL:
            return None
        owner = OgaExtRequestGetUserData(ready)
        return <object>owner if owner != NULL else None

    def max_draft_tokens_per_proposal(self):
        """OgaEngineMaxDraftTokensPerProposal."""
        cdef size_t out = 0
        if self._ptr == NULL:
            _raise_dead("Engine")
        check_result(OgaEngineMaxDraftTokensPerProposal(self._ptr, &out))
        return out


# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------

cdef object _generator_tokens(object tokens):
    """append_tokens' argument as one contiguous int32 array: an og.Tensor (encode_batch) or any
    1-D or 2-D array-like of token ids (a 2-D [batch_size, length] block is read row by row)."""
    as_numpy = getattr(tokens, "as_numpy", None)
    if as_numpy is not None and not isinstance(tokens, np.ndarray):
        tokens = as_numpy()
    arr = np.asarray(tokens)
    if arr.ndim == 2:
        arr = arr.reshape(-1)
    elif arr.ndim != 1:
        raise ValueError(f"tokens must be a 1-D or 2-D [batch_size, sequence_length] array, not {arr.ndim}-D.")
    return _tokens_to_int32_array(arr)


cdef class OgaGenerator:
    """onnxruntime-genai 0.18's Generator on the engine core (OgaGenerator*): batch_size sequences,
    one token each per generate_next_token. See include/oga/oga.h."""

    def __init__(self, OgaModel model not None, OgaGeneratorParams params not None):
        """OgaCreateGenerator (GIL released: it creates the Generator's engine)."""
        cdef c_OgaGenerator* generator = NULL
        cdef c_OgaResult* result
        if self._ptr != NULL:
            raise RuntimeError("Generator is already initialised.")
        if model._ptr == NULL:
            _raise_dead("Model")
        if params._ptr == NULL:
            _raise_dead("GeneratorParams")
        with nogil:
            result = OgaCreateGenerator(model._ptr, params._ptr, &generator)
        if result == NULL:
            self._ptr = generator  # released by __dealloc__ if an interruption is raised below
        _check_callbacks(result)

    def __dealloc__(self):
        # Without the GIL: a Generator on a shared engine (engine.shared_generators) waits for the
        # engine's owner thread, whose step may be running the Python executor.
        cdef c_OgaGenerator* generator = self._ptr
        self._ptr = NULL
        with nogil:
            OgaDestroyGenerator(generator)

    cdef int _alive(self) except -1:
        if self._ptr == NULL:
            _raise_dead("Generator")
        return 0

    def append_tokens(self, tokens):
        """OgaGenerator_AppendTokens (GIL released). `tokens`: a 1-D array of token ids, a 2-D
        [batch_size, length] block (right-padded, as encode_batch returns), or an og.Tensor."""
        cdef const int32_t[::1] view
        cdef const int32_t* data = NULL
        cdef size_t count
        cdef c_OgaResult* result
        self._alive()
        view = _generator_tokens(tokens)
        count = view.shape[0]
        if count > 0:
            data = &view[0]
        with nogil:
            result = OgaGenerator_AppendTokens(self._ptr, data, count)
        _check_callbacks(result)

    def generate_next_token(self):
        """OgaGenerator_GenerateNextToken (GIL released). A KeyboardInterrupt raised while the model
        runs reaches the caller; the interrupted token is then delivered by the next call."""
        cdef c_OgaResult* result
        self._alive()
        with nogil:
            result = OgaGenerator_GenerateNextToken(self._ptr)
        _check_callbacks(result)

    def is_done(self):
        """OgaExtGeneratorIsDone: every sequence ended (EOS) or reached max_length."""
        cdef cbool done = False
        self._alive()
        check_result(OgaExtGeneratorIsDone(self._ptr, &done))
        return done

    def token_count(self):
        """OgaGenerator_TokenCount: the sequence length."""
        self._alive()
        return OgaGenerator_TokenCount(self._ptr)

    def get_sequence(self, size_t index):
        """OgaGenerator_GetSequenceData: a copy of sequence `index` as an int32 array."""
        cdef size_t count
        cdef const int32_t* data
        self._alive()
        data = OgaGenerator_GetSequenceData(self._ptr, index)
        if data == NULL:
            raise IndexError(f"Sequence index {index} is out of range.")
        count = OgaGenerator_GetSequenceCount(self._ptr, index)
        return _copy_array(data, count, _INT32)

    def get_next_tokens(self):
        """OgaGenerator_GetNextTokens: a copy of the last token of every sequence."""
        cdef const int32_t* data = NULL
        cdef size_t count = 0
        self._alive()
        check_result(OgaGenerator_GetNextTokens(self._ptr, &data, &count))
        return _copy_array(data, count, _INT32)

    def rewind_to(self, size_t new_length):
        """OgaGenerator_RewindTo (GIL released)."""
        cdef c_OgaResult* result
        self._alive()
        with nogil:
            result = OgaGenerator_RewindTo(self._ptr, new_length)
        _check_callbacks(result)

    def get_logits(self):
        """OgaGenerator_GetLogits (GIL released): float32 [batch_size, 1, vocab_size]."""
        cdef c_OgaTensor* tensor = NULL
        cdef c_OgaResult* result
        cdef size_t rank = 0
        cdef int64_t shape[3]
        cdef void* data = NULL
        self._alive()
        with nogil:
            result = OgaGenerator_GetLogits(self._ptr, &tensor)
        _check_callbacks(result)
        try:
            check_result(OgaTensorGetShapeRank(tensor, &rank))
            if rank != 3:
                raise RuntimeError(f"OgaGenerator_GetLogits returned a rank-{rank} tensor.")
            check_result(OgaTensorGetShape(tensor, shape, 3))
            check_result(OgaTensorGetData(tensor, &data))
            out = _copy_array(data, <size_t>(shape[0] * shape[1] * shape[2]), _FLOAT32)
        finally:
            OgaDestroyTensor(tensor)
        return out.reshape(shape[0], shape[1], shape[2])

    def set_logits(self, logits):
        """OgaGenerator_SetLogits (GIL released): batch_size * vocab_size float32 logits, any shape."""
        cdef c_OgaTensor* tensor = NULL
        cdef c_OgaResult* result
        cdef int64_t count
        self._alive()
        arr = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
        count = arr.shape[0]
        cdef float[::1] view = arr
        check_result(OgaCreateTensorFromBuffer(<void*>&view[0] if count > 0 else NULL, &count, 1,
                                               1, &tensor))  # OgaElementType_float32
        try:
            with nogil:
                result = OgaGenerator_SetLogits(self._ptr, tensor)
            _check_callbacks(result)
        finally:
            OgaDestroyTensor(tensor)

    def set_runtime_option(self, str key, str value):
        """OgaGenerator_SetRuntimeOption: terminate_session "1" / "0" (any thread)."""
        self._alive()
        check_result(OgaGenerator_SetRuntimeOption(self._ptr, key.encode("utf-8"), value.encode("utf-8")))

    def get_speculative_stats(self):
        """OgaGenerator_GetSpeculativeStats, read into a dict (keys as in onnxruntime-genai 0.18)."""
        cdef c_OgaSpeculativeStats* stats = NULL
        self._alive()
        check_result(OgaGenerator_GetSpeculativeStats(self._ptr, &stats))
        return _speculative_stats_dict(stats)

    def get_input(self, str name):
        """OgaGenerator_GetInput: not supported by oga (raises)."""
        cdef c_OgaTensor* tensor = NULL
        self._alive()
        check_result(OgaGenerator_GetInput(self._ptr, name.encode("utf-8"), &tensor))

    def get_output(self, str name):
        """OgaGenerator_GetOutput: not supported by oga (raises)."""
        cdef c_OgaTensor* tensor = NULL
        self._alive()
        check_result(OgaGenerator_GetOutput(self._ptr, name.encode("utf-8"), &tensor))

    def set_inputs(self, named_tensors):
        """OgaGenerator_SetInputs: not supported by oga (raises)."""
        self._alive()
        check_result(OgaGenerator_SetInputs(self._ptr, NULL))

    def set_model_input(self, str name, value):
        """OgaGenerator_SetModelInput: not supported by oga (raises)."""
        self._alive()
        check_result(OgaGenerator_SetModelInput(self._ptr, name.encode("utf-8"), NULL))

    def set_hidden_states(self, hidden_states):
        """OgaGenerator_SetHiddenStates: not supported by oga (raises)."""
        self._alive()
        check_result(OgaGenerator_SetHiddenStates(self._ptr, NULL))

    def snapshot_state(self):
        """OgaGenerator_SnapshotState: not supported by oga (raises)."""
        self._alive()
        check_result(OgaGenerator_SnapshotState(self._ptr))

    def set_active_adapter(self, adapters, str adapter_name):
        """LoRA adapters (og.Adapters) are not supported by oga (raises NotImplementedError)."""
        from .unsupported import not_supported
        raise not_supported("Generator.set_active_adapter", "LoRA adapters loaded for a model")


# ---------------------------------------------------------------------------------------------
# Requests and options
# ---------------------------------------------------------------------------------------------

cdef OgaRequest _wrap_request(c_OgaRequest* request):
    cdef OgaRequest obj = OgaRequest.__new__(OgaRequest)
    obj._ptr = request
    # Borrowed: __dealloc__ clears it before releasing the handle, so events never see a dead object.
    OgaExtRequestSetUserData(request, <void*>obj)
    return obj


cdef class OgaRequest:
    """One conversation bound to an Engine (the request's one external OgaRequest* handle), made
    by Engine.create_request; or, as OGA 0.10-0.15 made them, Request(generator_params) for the
    step API (add_tokens, engine.add_request, engine.step(), get_unseen_token, ...)."""

    def __init__(self, *args, **kwargs):
        """OgaCreateRequest(params) for Request(params); any other form raises TypeError (0.18's
        Request has no public constructor)."""
        cdef c_OgaRequest* request = NULL
        if len(args) != 1 or kwargs or not isinstance(args[0], OgaGeneratorParams):
            raise TypeError(_NO_CONSTRUCTOR)
        if self._ptr != NULL:
            raise RuntimeError("Request is already initialised.")
        params = <OgaGeneratorParams>args[0]
        if params._ptr == NULL:
            _raise_dead("GeneratorParams")
        check_result(OgaCreateRequest(params._ptr, &request))
        self._ptr = request
        OgaExtRequestSetUserData(request, <void*>self)

    def _step_tokens(self, tokens, bint continuation):
        cdef int32_t small[_SMALL_TOKENS]
        cdef int32_t none_token = 0
        cdef TokenSpan span
        cdef c_OgaSequences* sequences = NULL
        cdef c_OgaResult* result
        if self._ptr == NULL:
            _raise_dead("Request")
        keep_alive = _tokens_to_span(tokens, &span, small)
        try:
            check_result(OgaCreateSequences(&sequences))
            check_result(OgaAppendTokenSequence(span.data if span.data != NULL else &none_token, span.count,
                                                sequences))
            with nogil:
                if continuation:
                    result = OgaRequestContinue(self._ptr, sequences)
                else:
                    result = OgaRequestAddTokens(self._ptr, sequences)
            _check_callbacks(result)
        finally:
            OgaDestroySequences(sequences)
            _release_span(&span)

    def add_tokens(self, tokens):
        """OgaRequestAddTokens: the prompt before engine.add_request, or a continuation once the
        turn is complete (step API). `tokens`: 1-D array-like of int32 token ids."""
        self._step_tokens(tokens, False)

    def continue_with(self, tokens):
        """OgaRequestContinue: the next turn's input once the current turn is complete."""
        self._step_tokens(tokens, True)

    def has_unseen_tokens(self):
        """OgaRequestHasUnseenTokens."""
        cdef cbool out = False
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestHasUnseenTokens(self._ptr, &out))
        return out

    def get_unseen_token(self):
        """OgaRequestGetUnseenToken: the next generated token not read yet."""
        cdef int32_t token = 0
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestGetUnseenToken(self._ptr, &token))
        return token

    def is_done(self):
        """OgaRequestIsDone: the turn ended (EOS or max_length) or the request was removed."""
        cdef cbool out = False
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestIsDone(self._ptr, &out))
        return out

    def is_turn_complete(self):
        """OgaRequestIsTurnComplete."""
        cdef cbool out = False
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestIsTurnComplete(self._ptr, &out))
        return out

    def set_opaque_data(self, data):
        """OgaRequestSetOpaqueData with the object itself; the Request keeps it alive."""
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestSetOpaqueData(self._ptr, <void*>data if data is not None else NULL))
        self._opaque = data

    def get_opaque_data(self):
        """OgaRequestGetOpaqueData: the object set_opaque_data stored, or None."""
        cdef void* data = NULL
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestGetOpaqueData(self._ptr, &data))
        return <object>data if data != NULL else None

    def __dealloc__(self):
        if self._ptr != NULL:
            OgaExtRequestSetUserData(self._ptr, NULL)
            OgaDestroyRequest(self._ptr)  # abandonment; any thread
            self._ptr = NULL

    def begin_turn(self, tokens, OgaTurnOptions turn_options=None):
        """OgaRequestBeginTurn (GIL released). `tokens`: 1-D array-like of int32 token ids.
        Returns the new turn id."""
        cdef int32_t small[_SMALL_TOKENS]
        cdef TokenSpan span
        cdef const c_OgaTurnOptions* c_turn_options = NULL
        cdef uint64_t turn_id = 0
        cdef c_OgaResult* result
        if self._ptr == NULL:
            _raise_dead("Request")
        if turn_options is not None:
            c_turn_options = turn_options._ptr
            if c_turn_options == NULL:
                _raise_dead("TurnOptions")
        keep_alive = _tokens_to_span(tokens, &span, small)
        try:
            with nogil:
                result = OgaRequestBeginTurn(self._ptr, c_turn_options, span.data, span.count, &turn_id)
        finally:
            _release_span(&span)
        _check_callbacks(result)  # the token-table loader and the tokenizer run in Python
        return turn_id

    def cancel_turn(self, uint64_t turn_id):
        """OgaRequestCancelTurn: True if the named current turn was cancelled."""
        cdef cbool cancelled = False
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestCancelTurn(self._ptr, turn_id, &cancelled))
        return cancelled

    def rewind_to_start_of_turn(self, uint64_t turn_id):
        """OgaRequestRewindToStartOfTurn."""
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestRewindToStartOfTurn(self._ptr, turn_id))

    def close(self):
        """OgaRequestClose: idempotent; stops scheduling and frees the request's cache."""
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestClose(self._ptr))

    def set_draft_tokens(self, tokens):
        """OgaRequestSetDraftTokens with one sequence built from `tokens` (empty clears)."""
        cdef int32_t small[_SMALL_TOKENS]
        cdef int32_t none_token = 0
        cdef TokenSpan span
        cdef c_OgaSequences* sequences = NULL
        if self._ptr == NULL:
            _raise_dead("Request")
        keep_alive = _tokens_to_span(tokens, &span, small)
        try:
            check_result(OgaCreateSequences(&sequences))
            check_result(OgaAppendTokenSequence(span.data if span.data != NULL else &none_token,
                                                span.count, sequences))
            check_result(OgaRequestSetDraftTokens(self._ptr, sequences))
        finally:
            OgaDestroySequences(sequences)
            _release_span(&span)


cdef class OgaRequestOptions:
    """Session policy (OgaRequestOptions*): reusable, copied at request creation."""

    def __init__(self):
        """OgaCreateRequestOptions."""
        cdef c_OgaRequestOptions* options = NULL
        if self._ptr != NULL:
            raise RuntimeError("RequestOptions is already initialised.")
        check_result(OgaCreateRequestOptions(&options))
        self._ptr = options

    def __dealloc__(self):
        OgaDestroyRequestOptions(self._ptr)
        self._ptr = NULL

    def set_max_session_tokens(self, uint64_t max_session_tokens):
        """OgaRequestOptionsSetMaxSessionTokens (0 = unset)."""
        if self._ptr == NULL:
            _raise_dead("RequestOptions")
        check_result(OgaRequestOptionsSetMaxSessionTokens(self._ptr, max_session_tokens))


cdef class OgaTurnOptions:
    """Per-turn policy (OgaTurnOptions*) bound to one Request; snapshotted at each begin_turn."""

    def __init__(self, request):
        """OgaRequestCreateTurnOptions."""
        cdef c_OgaTurnOptions* options = NULL
        if self._ptr != NULL:
            raise RuntimeError("TurnOptions is already initialised.")
        if not isinstance(request, OgaRequest):
            raise TypeError(f"request must be a Request, not {type(request).__name__}.")
        if (<OgaRequest>request)._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestCreateTurnOptions((<OgaRequest>request)._ptr, &options))
        self._ptr = options

    def __dealloc__(self):
        OgaDestroyTurnOptions(self._ptr)
        self._ptr = NULL

    cdef int _alive(self) except -1:
        if self._ptr == NULL:
            _raise_dead("TurnOptions")
        return 0

    def set_max_generated_tokens(self, uint64_t max_generated_tokens):
        """OgaTurnOptionsSetMaxGeneratedTokens (0 = unset)."""
        self._alive()
        check_result(OgaTurnOptionsSetMaxGeneratedTokens(self._ptr, max_generated_tokens))

    def set_min_generated_tokens(self, uint64_t min_generated_tokens):
        """OgaTurnOptionsSetMinGeneratedTokens (0 = unset)."""
        self._alive()
        check_result(OgaTurnOptionsSetMinGeneratedTokens(self._ptr, min_generated_tokens))

    def set_do_sample(self, bint do_sample):
        """OgaTurnOptionsSetDoSample."""
        self._alive()
        check_result(OgaTurnOptionsSetDoSample(self._ptr, do_sample))

    def set_temperature(self, float temperature):
        """OgaTurnOptionsSetTemperature."""
        self._alive()
        check_result(OgaTurnOptionsSetTemperature(self._ptr, temperature))

    def set_top_p(self, float top_p):
        """OgaTurnOptionsSetTopP."""
        self._alive()
        check_result(OgaTurnOptionsSetTopP(self._ptr, top_p))

    def set_top_k(self, int32_t top_k):
        """OgaTurnOptionsSetTopK."""
        self._alive()
        check_result(OgaTurnOptionsSetTopK(self._ptr, top_k))

    def set_repetition_penalty(self, float repetition_penalty):
        """OgaTurnOptionsSetRepetitionPenalty."""
        self._alive()
        check_result(OgaTurnOptionsSetRepetitionPenalty(self._ptr, repetition_penalty))

    def set_no_repeat_ngram_size(self, int32_t no_repeat_ngram_size):
        """OgaTurnOptionsSetNoRepeatNgramSize (0 disables)."""
        self._alive()
        check_result(OgaTurnOptionsSetNoRepeatNgramSize(self._ptr, no_repeat_ngram_size))

    def set_seed(self, uint64_t seed):
        """OgaTurnOptionsSetSeed."""
        self._alive()
        check_result(OgaTurnOptionsSetSeed(self._ptr, seed))

    def clear_seed(self):
        """OgaTurnOptionsClearSeed."""
        self._alive()
        check_result(OgaTurnOptionsClearSeed(self._ptr))

    def set_stop_strings(self, stop_strings):
        """OgaTurnOptionsSetStopStrings with an OgaStringArray built from `stop_strings` (empty clears)."""
        cdef c_OgaStringArray* array = NULL
        self._alive()
        if isinstance(stop_strings, (str, bytes)):
            raise TypeError("stop_strings must be a list of str, not a single string.")
        encoded = []
        for s in stop_strings:
            if not isinstance(s, str):
                raise TypeError(f"Stop strings must be str, not {type(s).__name__}.")
            b = (<str>s).encode("utf-8")
            if b"\0" in b:
                raise ValueError("Stop strings must not contain an embedded NUL byte.")
            encoded.append(b)
        try:
            check_result(OgaCreateStringArray(&array))
            for b in encoded:
                check_result(OgaStringArrayAddString(array, <bytes>b))
            check_result(OgaTurnOptionsSetStopStrings(self._ptr, array))
        finally:
            OgaDestroyStringArray(array)

    def set_guidance(self, str type, str data):
        """OgaTurnOptionsSetGuidance: whole-turn guidance (json_schema, regex or lark_grammar)."""
        self._alive()
        c_type = type.encode("utf-8")
        c_data = data.encode("utf-8")
        if b"\0" in c_type or b"\0" in c_data:
            raise ValueError("Guidance type and data must not contain an embedded NUL byte.")
        check_result(OgaTurnOptionsSetGuidance(self._ptr, c_type, c_data))

    def clear_guidance(self):
        """OgaTurnOptionsClearGuidance."""
        self._alive()
        check_result(OgaTurnOptionsClearGuidance(self._ptr))

    def reset(self):
        """OgaTurnOptionsReset: every field back to unset."""
        self._alive()
        check_result(OgaTurnOptionsReset(self._ptr))


# ---------------------------------------------------------------------------------------------
# Event buffers and borrowed views
# ---------------------------------------------------------------------------------------------

@cython.final
@cython.no_gc
cdef class OgaEngineEventBuffer:
    """Caller-owned event storage (OgaEngineEventBuffer*): a sequence over the events delivered by
    the last Engine.run. Created by Engine.create_event_buffer only."""

    def __init__(self, *args, **kwargs):
        raise TypeError(_NO_CONSTRUCTOR)

    def __dealloc__(self):
        OgaDestroyEngineEventBuffer(self._ptr)
        self._ptr = NULL

    @property
    def capacity(self):
        """OgaExtEngineEventBufferGetCapacity: slots the buffer was created with (oga addition)."""
        if self._ptr == NULL:
            _raise_dead("EngineEventBuffer")
        return OgaExtEngineEventBufferGetCapacity(self._ptr)

    def __len__(self):
        """OgaEngineEventBufferGetCount."""
        if self._ptr == NULL:
            _raise_dead("EngineEventBuffer")
        return OgaEngineEventBufferGetCount(self._ptr)

    def __getitem__(self, index):
        """OgaEngineEventBufferGet: an EngineEvent view (negative indices count from the end)."""
        cdef Py_ssize_t i, count
        if self._ptr == NULL:
            _raise_dead("EngineEventBuffer")
        count = <Py_ssize_t>OgaEngineEventBufferGetCount(self._ptr)
        if isinstance(index, slice):
            return [_make_event(self, j) for j in range(*index.indices(count))]
        try:
            i = index
        except OverflowError:
            raise IndexError("EngineEventBuffer index out of range") from None
        if i < 0:
            i += count
        if i < 0 or i >= count:
            raise IndexError("EngineEventBuffer index out of range")
        return _make_event(self, <size_t>i)

    def __iter__(self):
        if self._ptr == NULL:
            _raise_dead("EngineEventBuffer")
        cdef _EventBufferIterator it = _EventBufferIterator.__new__(_EventBufferIterator)
        it._buffer = self
        it._next = 0
        return it

    def __repr__(self):
        if self._ptr == NULL:
            return "<EngineEventBuffer (no handle)>"
        return (f"<EngineEventBuffer count={OgaEngineEventBufferGetCount(self._ptr)} "
                f"capacity={OgaExtEngineEventBufferGetCapacity(self._ptr)}>")


@cython.final
@cython.no_gc
@cython.freelist(4)
cdef class _EventBufferIterator:
    cdef OgaEngineEventBuffer _buffer
    cdef size_t _next

    def __iter__(self):
        return self

    def __next__(self):
        cdef size_t i = self._next
        if i >= OgaEngineEventBufferGetCount(self._buffer._ptr):
            raise StopIteration
        self._next = i + 1
        return _make_event(self._buffer, i)


cdef OgaEngineEvent _make_event(OgaEngineEventBuffer buffer, size_t index):
    cdef OgaEngineEvent event = OgaEngineEvent.__new__(OgaEngineEvent)
    event._buffer = buffer
    event._buf = buffer._ptr
    event._ev = OgaEngineEventBufferGet(buffer._ptr, index)
    event._generation = OgaExtEngineEventBufferGetGeneration(buffer._ptr)
    event._index = index
    return event


@cython.final
@cython.no_gc
@cython.freelist(64)
cdef class OgaEngineEvent:
    """Borrowed view of one event (OgaEngineEvent*). Valid until its buffer is run again; after
    that every property raises RuntimeError. Copy values out before the next Engine.run."""

    def __init__(self, *args, **kwargs):
        raise TypeError(_NO_CONSTRUCTOR)

    @property
    def flags(self):
        """OgaEngineEventGetFlags -> EngineEventFlags."""
        cdef OgaEngineEventFlags flags
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetFlags(self._ev, &flags))
        if flags < 32:
            return _FLAGS[flags]
        return EngineEventFlags(flags)

    @property
    def request(self):
        """OgaEngineEventGetRequest -> the caller's own Request object, or None (engine-level event
        or released handle)."""
        cdef const c_OgaRequest* request = NULL
        cdef void* owner
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetRequest(self._ev, &request))
        if request == NULL:
            return None
        owner = OgaExtRequestGetUserData(request)
        if owner == NULL:
            return None
        return <object>owner

    @property
    def turn_id(self):
        """OgaEngineEventGetTurnId (0 for engine-level events)."""
        cdef uint64_t turn_id
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetTurnId(self._ev, &turn_id))
        return turn_id

    @property
    def token(self):
        """OgaEngineEventGetToken: int when the TOKEN flag is set, else None."""
        cdef OgaEngineEventFlags flags
        cdef int32_t token
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetFlags(self._ev, &flags))
        if not (flags & _FLAG_TOKEN):
            return None
        check_result(OgaEngineEventGetToken(self._ev, &token))
        return token

    @property
    def finish_reason(self):
        """OgaEngineEventGetFinishReason -> FinishReason."""
        cdef OgaFinishReason reason
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetFinishReason(self._ev, &reason))
        if reason < 7:
            return _FINISH_REASONS[reason]
        return reason

    @property
    def matched_stop_string_index(self):
        """OgaEngineEventGetMatchedStopStringIndex: int when finish_reason is STOP_STRING, else None."""
        cdef OgaFinishReason reason
        cdef int32_t index
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetFinishReason(self._ev, &reason))
        if reason != _FINISH_STOP_STRING:
            return None
        check_result(OgaEngineEventGetMatchedStopStringIndex(self._ev, &index))
        return index

    @property
    def error_code(self):
        """OgaEngineEventGetErrorCode -> EngineErrorCode."""
        cdef OgaErrorCode code
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetErrorCode(self._ev, &code))
        if code < 7:
            return _ERROR_CODES[code]
        return code

    @property
    def usage(self):
        """OgaEngineEventGetUsage -> TurnUsage view (all zero on token-only and engine-level events)."""
        cdef const c_OgaTurnUsage* usage = NULL
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetUsage(self._ev, &usage))
        cdef OgaTurnUsage obj = OgaTurnUsage.__new__(OgaTurnUsage)
        obj._buffer = self._buffer
        obj._buf = self._buf
        obj._usage = usage
        obj._generation = self._generation
        return obj

    def __repr__(self):
        if OgaExtEngineEventBufferGetGeneration(self._buf) != self._generation:
            return f"<EngineEvent index={self._index} (stale)>"
        return (f"<EngineEvent flags={self.flags!r} request={self.request!r} turn_id={self.turn_id} "
                f"token={self.token} finish_reason={self.finish_reason!r} "
                f"matched_stop_string_index={self.matched_stop_string_index} "
                f"error_code={self.error_code!r} usage={self.usage!r}>")


@cython.final
@cython.no_gc
@cython.freelist(16)
cdef class OgaTurnUsage:
    """Borrowed view of an event's usage (OgaTurnUsage*); same lifetime as its event."""

    def __init__(self, *args, **kwargs):
        raise TypeError(_NO_CONSTRUCTOR)

    @property
    def prompt_tokens(self):
        """OgaTurnUsageGetPromptTokens."""
        cdef uint64_t value
        _check_fresh(self._buf, self._generation)
        check_result(OgaTurnUsageGetPromptTokens(self._usage, &value))
        return value

    @property
    def generated_tokens(self):
        """OgaTurnUsageGetGeneratedTokens."""
        cdef uint64_t value
        _check_fresh(self._buf, self._generation)
        check_result(OgaTurnUsageGetGeneratedTokens(self._usage, &value))
        return value

    @property
    def cached_prompt_tokens(self):
        """OgaTurnUsageGetCachedPromptTokens."""
        cdef uint64_t value
        _check_fresh(self._buf, self._generation)
        check_result(OgaTurnUsageGetCachedPromptTokens(self._usage, &value))
        return value

    def __repr__(self):
        if OgaExtEngineEventBufferGetGeneration(self._buf) != self._generation:
            return "<TurnUsage (stale)>"
        return (f"<TurnUsage prompt_tokens={self.prompt_tokens} generated_tokens={self.generated_tokens} "
                f"cached_prompt_tokens={self.cached_prompt_tokens}>")


@cython.final
cdef class OgaEngineCapabilities:
    """Engine capability snapshot (copied from OgaEngineCapabilities*). Created by
    Engine.get_capabilities only."""

    def __init__(self, *args, **kwargs):
        raise TypeError(_NO_CONSTRUCTOR)

    def __repr__(self):
        return (f"<EngineCapabilities configured_max_batch_size={self.configured_max_batch_size} "
                f"max_scheduled_tokens={self.max_scheduled_tokens} "
                f"max_request_length={self.max_request_length}>")


# ---------------------------------------------------------------------------------------------
# OgaExt helpers for oga.testing (private)
# ---------------------------------------------------------------------------------------------

def _library_path():
    """OgaExtLibraryPath: the shared library exporting the C API."""
    cdef const char* path = OgaExtLibraryPath()
    return None if path == NULL else os.fsdecode(<bytes>path)


def _test_model_create(str config_json):
    """OgaExtCreateTestModel."""
    cdef c_OgaModel* model = NULL
    encoded = config_json.encode("utf-8")
    check_result(OgaExtCreateTestModel(encoded, &model))
    return _wrap_model(model)


cdef void _fill_token_table(OgaExtTokenTable* table, bytes blob, object offsets, object special):
    """Points `table` at the caller's arrays (offsets: contiguous uintp, special: contiguous uint8)."""
    table.count = len(special)
    table.bytes = <const uint8_t*><const char*>blob
    table.offsets = <const size_t*><uintptr_t>offsets.ctypes.data
    table.special = <const uint8_t*><uintptr_t>special.ctypes.data


def _model_set_token_table(OgaModel model not None, bytes blob, object offsets, object special):
    """OgaExtModelSetTokenTable from oga.tokenizer.TokenTable arrays (see oga.testing.set_token_table)."""
    cdef OgaExtTokenTable table
    if model._ptr == NULL:
        _raise_dead("Model")
    if len(offsets) != len(special) + 1 or (len(special) > 0 and offsets[len(special)] > len(blob)):
        raise ValueError("token table arrays disagree: offsets needs one entry more than special, within the bytes")
    _fill_token_table(&table, blob, offsets, special)
    check_result(OgaExtModelSetTokenTable(model._ptr, &table))


def _test_model_inject_fault(OgaModel model not None, uint32_t phase, uint32_t kind, uint64_t skip, uint64_t count):
    """OgaExtTestModelInjectFault."""
    if model._ptr == NULL:
        _raise_dead("Model")
    check_result(OgaExtTestModelInjectFault(model._ptr, phase, kind, skip, count))


def _engine_check_invariants(OgaEngine engine not None):
    """OgaExtEngineCheckInvariants."""
    if engine._ptr == NULL:
        _raise_dead("Engine")
    check_result(OgaExtEngineCheckInvariants(engine._ptr))


def _engine_counters(OgaEngine engine not None):
    """OgaExtEngineGetCounters -> dict."""
    cdef OgaExtEngineCounters c
    if engine._ptr == NULL:
        _raise_dead("Engine")
    check_result(OgaExtEngineGetCounters(engine._ptr, &c))
    return {
        "model_runs": c.model_runs,
        "committed_steps": c.committed_steps,
        "rolled_back_steps": c.rolled_back_steps,
        "step_ns": c.step_ns,
        "executor_ns": c.executor_ns,
        "total_blocks": c.total_blocks,
        "free_blocks": c.free_blocks,
        "resident_requests": c.resident_requests,
        "waiting_requests": c.waiting_requests,
        "bound_requests": c.bound_requests,
        "retained_events": c.retained_events,
        "fixed_state_direct_steps": c.fixed_state_direct_steps,
        "fixed_state_fallback_steps": c.fixed_state_fallback_steps,
        "device_sampled_rows": c.device_sampled_rows,
        "host_read_logits_rows": c.host_read_logits_rows,
        "preemptions": c.preemptions,
        "recomputed_tokens": c.recomputed_tokens,
    }


cdef object _copy_array(const void* data, size_t count, object dtype):
    arr = np.zeros(count, dtype=dtype)
    cdef unsigned char[::1] dst
    if data != NULL and count > 0:
        dst = arr.view(np.uint8)
        memcpy(&dst[0], data, count * arr.itemsize)
    return arr


def _engine_last_step_inputs(OgaEngine engine not None):
    """OgaExtEngineGetLastStepInputs -> dict of numpy copies."""
    cdef OgaExtStepInputs s
    if engine._ptr == NULL:
        _raise_dead("Engine")
    check_result(OgaExtEngineGetLastStepInputs(engine._ptr, &s))
    rows = s.num_rows
    columns = s.block_table_columns
    return {
        "num_rows": rows,
        "num_tokens": s.num_tokens,
        "input_ids": _copy_array(s.input_ids, s.num_tokens, np.int64),
        "position_ids": _copy_array(s.position_ids, s.num_tokens, np.int64),
        "cumulative_sequence_lengths": _copy_array(
            s.cumulative_sequence_lengths, s.num_rows + 1 if s.cumulative_sequence_lengths != NULL else 0, np.int32),
        "past_sequence_lengths": _copy_array(s.past_sequence_lengths, s.num_rows, np.int32),
        "block_table": _copy_array(s.block_table, s.num_rows * s.block_table_columns, np.int32).reshape(
            rows, columns),
        "attention_metadata": _copy_array(s.attention_metadata, 3 if s.attention_metadata != NULL else 0, np.int32),
        "logits_indices": _copy_array(s.logits_indices, s.num_rows if s.logits_indices != NULL else 0, np.int32),
        "graph_eligible": bool(s.graph_eligible),
        "num_fixed_states": s.num_fixed_states,
        "fixed_state_direct": bool(s.fixed_state_direct),
        "graph_id": s.graph_id,
    }


def _request_fixed_state_slot(OgaRequest request not None):
    """OgaExtRequestGetFixedStateSlot -> dict (slot -1: the request owns none)."""
    cdef OgaExtFixedStateSlot c
    if request._ptr == NULL:
        _raise_dead("Request")
    check_result(OgaExtRequestGetFixedStateSlot(request._ptr, &c))
    return {
        "slot": c.slot,
        "active_bank": c.active_bank,
        "allocation_generation": c.allocation_generation,
        "state_generation": c.state_generation,
        "committed_tokens": c.committed_tokens,
    }


def _request_fixed_state_row(OgaRequest request not None, size_t tensor):
    """OgaExtRequestGetFixedStateRow -> bytes (a copy of the committed row)."""
    cdef const void* data = NULL
    cdef size_t size = 0
    if request._ptr == NULL:
        _raise_dead("Request")
    check_result(OgaExtRequestGetFixedStateRow(request._ptr, tensor, &data, &size))
    return (<const char*>data)[:size]


def _engine_set_fixed_state_fallback_only(OgaEngine engine not None, bint fallback_only):
    """OgaExtEngineSetFixedStateFallbackOnly."""
    if engine._ptr == NULL:
        _raise_dead("Engine")
    check_result(OgaExtEngineSetFixedStateFallbackOnly(engine._ptr, 1 if fallback_only else 0))


def _request_set_last_turn_id(OgaRequest request not None, uint64_t turn_id):
    """OgaExtRequestSetLastTurnIdForTesting."""
    if request._ptr == NULL:
        _raise_dead("Request")
    check_result(OgaExtRequestSetLastTurnIdForTesting(request._ptr, turn_id))


# ---------------------------------------------------------------------------------------------
# The ONNX Runtime model loader (OgaExtModelLoader) and executor trampolines. The executor itself
# is oga/executor/; these functions only cross between the C callback table and Python.
# ---------------------------------------------------------------------------------------------

cdef void _write_message(char* message, size_t capacity, object text) noexcept:
    cdef bytes encoded
    if capacity == 0:
        return
    try:
        encoded = str(text).encode("utf-8", "replace")[:capacity - 1]
    except BaseException as error:
        if _is_interruption(error):
            _defer_interruption(error)
        encoded = b"oga: the executor failure message could not be encoded"
    memcpy(message, <const char*>encoded, len(encoded))
    message[len(encoded)] = 0


cdef OgaExtExecutionStatus _callback_failure(object error, char* message, size_t capacity,
                                             OgaExtExecutionStatus status, bint typed=True) noexcept:
    """What a callback returns for `error`: Interrupted for an interruption (kept for the wrapper of
    the core call, see _defer_interruption), else `status` with the error's text in `message`
    ("TypeName: text" when `typed`)."""
    if _is_interruption(error):
        _defer_interruption(error)
        _write_message(message, capacity, "interrupted")
        return _STATUS_INTERRUPTED
    try:
        text = f"{type(error).__name__}: {error}" if typed else error
    except BaseException as format_error:
        if _is_interruption(format_error):
            _defer_interruption(format_error)
        text = type(error).__name__
    _write_message(message, capacity, text)
    # An interruption that landed while the message was formatted still wins.
    return _STATUS_INTERRUPTED if _interruption_deferred() else status


cdef str _text(const char* value):
    return "" if value == NULL else value.decode("utf-8")


cdef list _texts(const char* const* values, size_t count):
    return [_text(values[i]) for i in range(count)]


cdef size_t _fixed_state_row_bytes(object decoder) except? 0:
    """Address of the decoder's per-tensor fixed-state row bytes (size_t[]), kept alive by the
    decoder object (the model's model_data) for as long as the engine core may read it; 0 = none."""
    row_bytes = np.array([t.row_bytes for t in decoder.fixed_states], dtype=np.uintp)
    decoder.fixed_state_row_bytes_array = row_bytes
    return <size_t>row_bytes.ctypes.data if row_bytes.size else 0


cdef list _fixed_state_bindings(const OgaExtStepInputs* inputs):
    """(input, output[, capture]) addresses per fixed tensor of a hybrid step, rows in packed order."""
    cdef size_t t
    if inputs.fixed_state_captures != NULL:
        return [(<size_t>inputs.fixed_state_inputs[t], <size_t>inputs.fixed_state_outputs[t],
                 <size_t>inputs.fixed_state_captures[t]) for t in range(inputs.num_fixed_states)]
    return [(<size_t>inputs.fixed_state_inputs[t], <size_t>inputs.fixed_state_outputs[t])
            for t in range(inputs.num_fixed_states)]


_STATE_GROUP_KINDS = {1: "fixed_conv", 2: "fixed_recurrent"}


cdef dict _decoder_names(const OgaExtDecoderNames* names):
    """OgaExtDecoderNames as the Python executor takes it: the tensor names, state groups and sizes
    the core resolved from the configuration (nothing here reads genai_config.json again)."""
    cdef size_t i
    return {
        "model_directory": _text(names.model_directory),
        "decoder_filename": _text(names.decoder_filename),
        "input_ids": _text(names.input_ids),
        "position_ids": _text(names.position_ids),
        "cumulative_sequence_lengths": _text(names.cumulative_sequence_lengths),
        "past_sequence_lengths": _text(names.past_sequence_lengths),
        "block_table": _text(names.block_table),
        "block_table_windowed": _text(names.block_table_windowed),
        "attention_metadata": _text(names.attention_metadata),
        "attention_mask": _text(names.attention_mask),
        "logits_indices": _text(names.logits_indices),
        "logits": _text(names.logits),
        "paged_layer_ids": [names.paged_layer_ids[i] for i in range(names.num_paged_layers)],
        "past_key_names": _texts(names.past_key_names, names.num_paged_layers),
        "past_value_names": _texts(names.past_value_names, names.num_paged_layers),
        "present_key_names": _texts(names.present_key_names, names.num_paged_layers),
        "present_value_names": _texts(names.present_value_names, names.num_paged_layers),
        "block_size": names.block_size,
        "vocab_size": names.vocab_size,
        "fixed_states": [(_STATE_GROUP_KINDS[names.fixed_states[i].kind], names.fixed_states[i].layer_id,
                          _text(names.fixed_states[i].input), _text(names.fixed_states[i].output))
                         for i in range(names.num_fixed_states)],
        "sliding_window_layers": [names.sliding_window_layers[i] for i in range(names.num_sliding_window_layers)],
        "num_key_value_heads": names.num_key_value_heads,
        "head_size": names.head_size,
        "num_hidden_layers": names.num_hidden_layers,
        "num_blocks": names.num_blocks,
        "session_options": json.loads(_text(names.session_options_json)),
    }


def _config_decoder_names(OgaConfig config):
    """Test support: what the model loader would receive for `config` (OgaExtConfigGetDecoderNames)."""
    cdef const OgaExtDecoderNames* names = NULL
    config._alive()
    check_result(OgaExtConfigGetDecoderNames(config._ptr, &names))
    return _decoder_names(names)


cdef OgaExtExecutionStatus _onnx_load(const OgaExtDecoderNames* names, OgaExtModelExecutor* executor,
                                      char* message, size_t capacity) noexcept nogil:
    with gil:
        decoder = None
        try:
            import importlib
            executors = importlib.import_module("oga.executor")
            native_executor = importlib.import_module("oga.executor.native")
            decoder = executors.load_decoder(_decoder_names(names), native_executor.requested())
            executor.per_token_logits = 1 if decoder.per_token_logits else 0
            executor.windowed_block_table = 1 if decoder.windowed_block_table else 0
            executor.bytes_per_window_block = getattr(decoder, "bytes_per_window_block", 0)
            executor.max_block_table_columns = 0
            executor.bytes_per_block = decoder.bytes_per_block
            # Fixed state (hybrid models): per-tensor row bytes, kept alive by the decoder object
            # (the model's model_data) for as long as the engine core may read them.
            executor.num_fixed_states = len(decoder.fixed_states)
            executor.fixed_state_row_bytes = <const size_t*><size_t>_fixed_state_row_bytes(decoder)
            executor.fixed_state_capture = 1 if getattr(decoder, "fixed_state_capture", False) else 0
            executor.cuda_graph = 1 if getattr(decoder, "cuda_graph", False) else 0
            # A decoder on a device hands the core its device operations (oga.device_ops.DeviceOps);
            # the table is kept by the decoder (the model's model_data), which outlives the core's use.
            device_ops = getattr(decoder, "device_ops", None)
            if device_ops is not None:
                decoder._device_ops_table = _device_ops_table(device_ops)
                executor.device_ops = <const OgaExtDeviceOps*><size_t>decoder._device_ops_table.address
            # A decoder whose session the native executor created (oga/executor/native.py, the
            # default for decoders on the CPU provider): it takes over the table's callbacks and
            # model_data; a step then never takes the GIL.
            if native_executor.attach(decoder, <size_t>executor):
                return 0
        except BaseException as error:
            status = _callback_failure(error, message, capacity, 3, False)  # OgaExtExecutionStatus_Fatal
            if decoder is not None and hasattr(decoder, "close"):
                try:
                    decoder.close()  # its device, opened for a model that will not exist
                except BaseException as close_error:
                    if _is_interruption(close_error):
                        _defer_interruption(close_error)
            return status
        Py_INCREF(decoder)  # owned by the model; released by _onnx_release_model
        executor.model_data = <void*>decoder
        executor.open_engine = _onnx_open_engine
        executor.execute = _onnx_execute
        executor.close_engine = _onnx_close_engine
        executor.release_model = _onnx_release_model
        executor.execute_static = _onnx_execute_static
        return 0


cdef OgaExtExecutionStatus _onnx_open_engine(void* model_data, const OgaExtEngineGeometry* geometry,
                                             void** engine_data, char* message, size_t capacity) noexcept nogil:
    with gil:
        try:
            engine = (<object>model_data).open_engine({
                "block_size": geometry.block_size,
                "num_blocks": geometry.num_blocks,
                "max_batch_size": geometry.max_batch_size,
                "max_scheduled_tokens": geometry.max_scheduled_tokens,
                "max_block_table_columns": geometry.max_block_table_columns,
                "vocab_size": geometry.vocab_size,
                "max_sequence_length": geometry.max_sequence_length,
                "window_ring_blocks": geometry.window_ring_blocks,
                "window_blocks": geometry.window_blocks,
                "fixed_state_slots": geometry.fixed_state_slots,
            })
        except MemoryError as error:
            _write_message(message, capacity, f"cannot allocate the KV cache: {error}")
            return 2  # OgaExtExecutionStatus_CapacityExceeded
        except BaseException as error:
            return _callback_failure(error, message, capacity, 3, False)
        Py_INCREF(engine)  # owned by the engine; released by close_engine
        engine_data[0] = <void*>engine
        return 0


cdef OgaExtExecutionStatus _onnx_execute(void* engine_data, const OgaExtStepInputs* inputs,
                                         OgaExtStepOutputs* outputs, char* message, size_t capacity) noexcept nogil:
    with gil:
        executor = <object>engine_data
        try:
            fixed_state = _fixed_state_bindings(inputs) if inputs.num_fixed_states > 0 else None
            status, text, address, rows = executor.execute(
                inputs.num_rows, inputs.num_tokens, <size_t>inputs.input_ids, <size_t>inputs.position_ids,
                <size_t>inputs.cumulative_sequence_lengths, <size_t>inputs.past_sequence_lengths,
                <size_t>inputs.block_table, inputs.block_table_columns, <size_t>inputs.attention_metadata,
                <size_t>inputs.logits_indices, <size_t>inputs.block_table_windowed, fixed_state, inputs.graph_id)
            if status != 0:
                _write_message(message, capacity, text)
                return status
            outputs.logits = <const void*><size_t>address
            outputs.logits_type = executor.logits_type
            outputs.logits_rows = rows
            outputs.logits_row_stride = executor.vocab
            outputs.logits_on_device = 1 if executor.logits_on_device else 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 3)  # OgaExtExecutionStatus_Fatal
        return 0


cdef OgaExtExecutionStatus _onnx_execute_static(void* engine_data, const OgaExtStaticStepInputs* inputs,
                                                OgaExtStepOutputs* outputs, char* message,
                                                size_t capacity) noexcept nogil:
    with gil:
        executor = <object>engine_data
        try:
            status, text, address, rows = executor.execute_static(
                inputs.batch_size, inputs.sequence_length, inputs.total_sequence_length, <size_t>inputs.input_ids,
                <size_t>inputs.attention_mask, <size_t>inputs.logits_positions)
            if status != 0:
                _write_message(message, capacity, text)
                return status
            outputs.logits = <const void*><size_t>address
            outputs.logits_type = executor.logits_type
            outputs.logits_rows = rows
            outputs.logits_row_stride = executor.vocab
        except BaseException as error:
            return _callback_failure(error, message, capacity, 3)  # OgaExtExecutionStatus_Fatal
        return 0


cdef void _onnx_release_model(void* data) noexcept nogil:
    """release_model: the decoder frees its device (DeviceOps staging and scratch, the CUDA stream)
    now; a CudaDevice frees nothing when it is collected."""
    with gil:
        decoder = <object>data
        try:
            close = getattr(decoder, "close", None)
            if close is not None:
                close()
        except BaseException as error:
            import warnings
            warnings.warn(f"oga: releasing the ONNX Runtime decoder's device failed: {type(error).__name__}: {error}",
                          RuntimeWarning)
        Py_DECREF(decoder)


cdef void _onnx_close_engine(void* data) noexcept nogil:
    """close_engine: the executor releases its device memory now, not whenever it is collected."""
    with gil:
        executor = <object>data
        try:
            executor.close()
        except BaseException as error:
            import warnings
            warnings.warn(f"oga: closing the ONNX Runtime executor failed: {type(error).__name__}: {error}",
                          RuntimeWarning)
        Py_DECREF(executor)


# ---------------------------------------------------------------------------------------------
# OgaExtDeviceOps over a Python object (oga/device_ops.py DeviceOps): the table's context is the
# object, each callback calls its method of the same name with the core's host arrays as numpy
# views (no copies, valid only during the call). An exception becomes a nonzero return with
# "TypeName: text" in `message`; allocate returns NULL on any exception (the core's only failure
# for it: out of memory).
# ---------------------------------------------------------------------------------------------

cdef object _host_array(const void* data, size_t count, object dtype, size_t itemsize, bint writable=False):
    """A numpy view of `count` elements at `data` (read-only unless `writable`)."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    if data == NULL:
        raise ValueError(f"NULL array of {count} elements")
    return np.frombuffer(PyMemoryView_FromMemory(<char*>data, <Py_ssize_t>(count * itemsize),
                                                 PyBUF_WRITE if writable else PyBUF_READ), dtype=dtype)


cdef object _ADDRESS = np.dtype(np.uintp)
cdef object _INT32 = np.dtype(np.int32)
cdef object _INT64 = np.dtype(np.int64)
cdef object _UINT64 = np.dtype(np.uint64)
cdef object _FLOAT32 = np.dtype(np.float32)


cdef void* _device_allocate(void* context, size_t nbytes) noexcept nogil:
    with gil:
        try:
            return <void*><size_t>(<object>context).allocate(nbytes)
        except BaseException as error:
            if _is_interruption(error):
                _defer_interruption(error)  # engine creation fails; its wrapper raises it
                return NULL
            # The contract's only failure is NULL, which the core reports as a budget too small; a
            # device failure that is not out-of-memory is named here so it is not mistaken for one.
            import warnings
            warnings.warn(f"oga: a device allocation of {nbytes} bytes failed: {type(error).__name__}: {error}",
                          RuntimeWarning)
            return NULL


cdef void _device_release(void* context, void* memory) noexcept nogil:
    # The contract has no failure here; an exception is reported as unraisable (printed).
    with gil:
        (<object>context).release(<size_t>memory)


cdef int32_t _device_copy(void* context, size_t count, const void* const* sources, void* const* destinations,
                          size_t nbytes, char* message, size_t capacity) noexcept nogil:
    with gil:
        try:
            (<object>context).copy(_host_array(sources, count, _ADDRESS, sizeof(void*)),
                                   _host_array(destinations, count, _ADDRESS, sizeof(void*)), nbytes)
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_fill_zero(void* context, void* memory, size_t nbytes, char* message,
                               size_t capacity) noexcept nogil:
    with gil:
        try:
            (<object>context).fill_zero(<size_t>memory, nbytes)
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_synchronize(void* context, char* message, size_t capacity) noexcept nogil:
    with gil:
        try:
            (<object>context).synchronize()
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_memory_info(void* context, size_t* free_bytes, size_t* total_bytes, char* message,
                                 size_t capacity) noexcept nogil:
    with gil:
        try:
            free, total = (<object>context).memory_info()
            free_bytes[0] = free
            total_bytes[0] = total
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_read(void* context, size_t count, const void* const* sources, void* const* destinations,
                          size_t nbytes, char* message, size_t capacity) noexcept nogil:
    with gil:
        try:
            (<object>context).read(_host_array(sources, count, _ADDRESS, sizeof(void*)),
                                   _host_array(destinations, count, _ADDRESS, sizeof(void*)), nbytes)
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_sample(void* context, const OgaExtDeviceSampling* sampling, char* message,
                            size_t capacity) noexcept nogil:
    cdef size_t n = sampling.num_rows
    cdef int64_t history = 0
    with gil:
        try:
            if n > 0 and sampling.history_offsets != NULL:
                history = sampling.history_offsets[n]
                if history < 0:
                    raise ValueError(f"history_offsets[{n}] is {history}")
            (<object>context).sample(
                n, <size_t>sampling.logits, sampling.logits_type, sampling.logits_row_stride, sampling.vocab_size,
                _host_array(sampling.logits_rows, n, _INT32, 4),
                _host_array(sampling.temperatures, n, _FLOAT32, 4),
                _host_array(sampling.top_ks, n, _INT32, 4),
                _host_array(sampling.top_ps, n, _FLOAT32, 4),
                _host_array(sampling.seeds, n, _UINT64, 8),
                _host_array(sampling.counters, n, _UINT64, 8),
                _host_array(sampling.mask_eos, n, _INT32, 4),
                _host_array(sampling.eos_ids, sampling.num_eos, _INT32, 4),
                _host_array(sampling.repetition_penalties, n, _FLOAT32, 4),
                _host_array(sampling.history_offsets, n + 1 if n > 0 else 0, _INT64, 8),
                _host_array(sampling.history_tokens, <size_t>history, _INT32, 4),
                _host_array(sampling.tokens, n, _INT32, 4, True))
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef class _DeviceOpsTable:
    """An OgaExtDeviceOps table (embedded, so its address is stable) over a Python operations
    object, which this table keeps alive. Whoever gives `address` to the core keeps the table for
    as long as the core may call it. Made by _device_ops_table()."""

    cdef OgaExtDeviceOps table
    cdef readonly object ops

    def __init__(self):
        raise TypeError(_NO_CONSTRUCTOR)

    @property
    def address(self):
        """The OgaExtDeviceOps* as an int."""
        return <size_t>&self.table


def _device_ops_table(ops):
    """The OgaExtDeviceOps table over `ops` (oga.device_ops.DeviceOps, or any object with its
    methods): `.address` is the table's address. `sample` is NULL when ops.samples_on_device is
    false (the engine then reads logits rows back and selects on the host)."""
    cdef _DeviceOpsTable table = _DeviceOpsTable.__new__(_DeviceOpsTable)
    table.ops = ops
    table.table.context = <void*>ops
    table.table.allocate = _device_allocate
    table.table.release = _device_release
    table.table.copy = _device_copy
    table.table.fill_zero = _device_fill_zero
    table.table.synchronize = _device_synchronize
    table.table.read = _device_read
    table.table.memory_info = _device_memory_info
    table.table.sample = NULL
    if getattr(ops, "samples_on_device", True):
        table.table.sample = _device_sample
    return table


# The token table the engine copies while the loader runs; kept until the next load.
cdef object _loaded_token_table = None


cdef OgaExtExecutionStatus _token_table_load(const char* directory, OgaExtTokenTable* table,
                                             char* message, size_t capacity) noexcept nogil:
    global _loaded_token_table
    with gil:
        try:
            import importlib
            tokenizer = importlib.import_module("oga.tokenizer")
            blob, offsets, special = tokenizer._engine_token_table(_text(directory))
            _loaded_token_table = (blob, offsets, special)
            _fill_token_table(table, blob, offsets, special)
            return 0  # OgaExtExecutionStatus_Ok
        except BaseException as error:
            return _callback_failure(error, message, capacity, 3)  # OgaExtExecutionStatus_Fatal


cdef size_t _tokenize(const char* directory, const uint8_t* data, size_t count, uint32_t* tokens,
                      size_t capacity) noexcept nogil:
    cdef size_t i
    with gil:
        try:
            import importlib
            tokenizer = importlib.import_module("oga.tokenizer")
            ids = tokenizer._engine_tokenize(_text(directory), (<const char*>data)[:count])
            n = len(ids)
            for i in range(min(<size_t>n, capacity)):
                tokens[i] = ids[i]
            return n
        except BaseException as error:
            if _is_interruption(error):
                _defer_interruption(error)
                return <size_t>-1  # OgaExtTokenize_Interrupted
            return 0


def _register_model_loader():
    """OgaExtSetModelLoader (ONNX Runtime loader), OgaExtSetTokenTableLoader and
    OgaExtSetTokenizeFunction (tokenizer.json through the `tokenizers` package): done once when oga
    is imported."""
    OgaExtSetModelLoader(_onnx_load)
    OgaExtSetTokenTableLoader(_token_table_load)
    OgaExtSetTokenizeFunction(_tokenize)


def _set_guidance_library(path):
    """OgaExtSetGuidanceLibrary (None clears)."""
    cdef bytes encoded
    if path is None:
        check_result(OgaExtSetGuidanceLibrary(NULL))
        return
    encoded = os.fsencode(path)
    check_result(OgaExtSetGuidanceLibrary(encoded))
