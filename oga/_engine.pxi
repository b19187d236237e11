# Part of oga/_core.pyx (included there; compiled as one module).

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

    def create_event_buffer(self, capacity):
        """OgaCreateEngineEventBuffer: an event buffer with `capacity` slots, bound to this engine."""
        cdef c_OgaEngineEventBuffer* buffer = NULL
        cdef size_t c_capacity = _size_t(capacity, "capacity")
        if self._ptr == NULL:
            _raise_dead("Engine")
        check_result(OgaCreateEngineEventBuffer(self._ptr, c_capacity, &buffer))
        cdef OgaEngineEventBuffer obj = OgaEngineEventBuffer.__new__(OgaEngineEventBuffer)
        obj._ptr = buffer
        return obj

    def run(self, OgaEngineEventBuffer buffer=None, *, max_events=None):
        """OgaEngineRun (GIL released). run(buffer) returns `buffer`; the seed-era run(max_events=N)
        runs a cached internal buffer of capacity N and returns a list of its event views.
        A KeyboardInterrupt (any BaseException that is not an Exception) raised by Python code the
        step ran, such as the Python executor, is raised from here once the core returns: the step
        was rolled back, the engine is healthy, and the next run delivers its Retryable event. A
        Ctrl-C while a native step runs is raised once the step is done; its events go back to the
        engine (OgaExtEngineRequeueEvents) and the next run delivers them."""
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
        try:
            # A Ctrl-C while the step ran without the GIL (the native executor never re-enters Python)
            # is raised here, not after this returns: the caller would never receive the buffer, so
            # its events go back to the engine and the next run delivers them.
            PyErr_CheckSignals()
        except BaseException:
            OgaDestroyResult(OgaExtEngineRequeueEvents(self._ptr, buffer._ptr))
            raise
        return buffer

    def _run_compat(self, buffer, max_events):
        if buffer is not None or max_events is None:
            raise TypeError("run() takes exactly one of buffer or max_events.")
        cdef size_t capacity = _size_t(max_events, "max_events")
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
# OgaExt engine statistics (oga.introspection: oga serve's /metrics, tests)
# ---------------------------------------------------------------------------------------------

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
