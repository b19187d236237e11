# Part of oga/_core.pyx (included there; compiled as one module).

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

    def cancel_turn(self, turn_id):
        """OgaRequestCancelTurn: True if the named current turn was cancelled."""
        cdef uint64_t c_turn_id = _uint64(turn_id, "turn_id")
        cdef cbool cancelled = False
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestCancelTurn(self._ptr, c_turn_id, &cancelled))
        return cancelled

    def rewind_to_start_of_turn(self, turn_id):
        """OgaRequestRewindToStartOfTurn."""
        cdef uint64_t c_turn_id = _uint64(turn_id, "turn_id")
        if self._ptr == NULL:
            _raise_dead("Request")
        check_result(OgaRequestRewindToStartOfTurn(self._ptr, c_turn_id))

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

    def set_max_session_tokens(self, max_session_tokens):
        """OgaRequestOptionsSetMaxSessionTokens (0 = unset)."""
        cdef uint64_t c_max_session_tokens = _uint64(max_session_tokens, "max_session_tokens")
        if self._ptr == NULL:
            _raise_dead("RequestOptions")
        check_result(OgaRequestOptionsSetMaxSessionTokens(self._ptr, c_max_session_tokens))


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

    def set_max_generated_tokens(self, max_generated_tokens):
        """OgaTurnOptionsSetMaxGeneratedTokens (0 = unset)."""
        cdef uint64_t c_max_generated_tokens = _uint64(max_generated_tokens, "max_generated_tokens")
        self._alive()
        check_result(OgaTurnOptionsSetMaxGeneratedTokens(self._ptr, c_max_generated_tokens))

    def set_min_generated_tokens(self, min_generated_tokens):
        """OgaTurnOptionsSetMinGeneratedTokens (0 = unset)."""
        cdef uint64_t c_min_generated_tokens = _uint64(min_generated_tokens, "min_generated_tokens")
        self._alive()
        check_result(OgaTurnOptionsSetMinGeneratedTokens(self._ptr, c_min_generated_tokens))

    def set_do_sample(self, do_sample):
        """OgaTurnOptionsSetDoSample."""
        cdef bint c_do_sample = _boolean(do_sample, "do_sample")
        self._alive()
        check_result(OgaTurnOptionsSetDoSample(self._ptr, c_do_sample))

    def set_temperature(self, float temperature):
        """OgaTurnOptionsSetTemperature."""
        self._alive()
        check_result(OgaTurnOptionsSetTemperature(self._ptr, temperature))

    def set_top_p(self, float top_p):
        """OgaTurnOptionsSetTopP."""
        self._alive()
        check_result(OgaTurnOptionsSetTopP(self._ptr, top_p))

    def set_top_k(self, top_k):
        """OgaTurnOptionsSetTopK."""
        cdef int32_t c_top_k = _int32(top_k, "top_k")
        self._alive()
        check_result(OgaTurnOptionsSetTopK(self._ptr, c_top_k))

    def set_repetition_penalty(self, float repetition_penalty):
        """OgaTurnOptionsSetRepetitionPenalty."""
        self._alive()
        check_result(OgaTurnOptionsSetRepetitionPenalty(self._ptr, repetition_penalty))

    def set_no_repeat_ngram_size(self, no_repeat_ngram_size):
        """OgaTurnOptionsSetNoRepeatNgramSize (0 disables)."""
        cdef int32_t c_no_repeat_ngram_size = _int32(no_repeat_ngram_size, "no_repeat_ngram_size")
        self._alive()
        check_result(OgaTurnOptionsSetNoRepeatNgramSize(self._ptr, c_no_repeat_ngram_size))

    def set_seed(self, seed):
        """OgaTurnOptionsSetSeed."""
        cdef uint64_t c_seed = _uint64(seed, "seed")
        self._alive()
        check_result(OgaTurnOptionsSetSeed(self._ptr, c_seed))

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

    def set_guidance(self, str type not None, str data not None):
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
