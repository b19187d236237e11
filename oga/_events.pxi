# Part of oga/_core.pyx (included there; compiled as one module).

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
        if flags < len(_FLAGS):
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
        if not (flags & OgaEngineEventFlag_Token):
            return None
        check_result(OgaEngineEventGetToken(self._ev, &token))
        return token

    @property
    def finish_reason(self):
        """OgaEngineEventGetFinishReason -> FinishReason."""
        cdef OgaFinishReason reason
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetFinishReason(self._ev, &reason))
        if reason < len(_FINISH_REASONS):
            return _FINISH_REASONS[reason]
        return reason

    @property
    def matched_stop_string_index(self):
        """OgaEngineEventGetMatchedStopStringIndex: int when finish_reason is STOP_STRING, else None."""
        cdef OgaFinishReason reason
        cdef int32_t index
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetFinishReason(self._ev, &reason))
        if reason != OgaFinishReason_StopString:
            return None
        check_result(OgaEngineEventGetMatchedStopStringIndex(self._ev, &index))
        return index

    @property
    def error_code(self):
        """OgaEngineEventGetErrorCode -> EngineErrorCode."""
        cdef OgaErrorCode code
        _check_fresh(self._buf, self._generation)
        check_result(OgaEngineEventGetErrorCode(self._ev, &code))
        if code < len(_ERROR_CODES):
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
