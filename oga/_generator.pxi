# Part of oga/_core.pyx (included there; compiled as one module).

# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------

cdef object _generator_tokens(object tokens, size_t batch_size):
    """append_tokens' argument as one contiguous int32 array: an og.Tensor (encode_batch) or any
    1-D or 2-D array-like of token ids (a 2-D [batch_size, length] block is read row by row and
    must have batch_size rows)."""
    as_numpy = getattr(tokens, "as_numpy", None)
    if as_numpy is not None and not isinstance(tokens, np.ndarray):
        tokens = as_numpy()
    arr = np.asarray(tokens)
    if arr.ndim == 2:
        if <size_t>arr.shape[0] != batch_size:
            raise ValueError(f"tokens is a [{arr.shape[0]}, {arr.shape[1]}] block, but the Generator's batch_size is "
                             f"{batch_size}: a 2-D block must be [batch_size, sequence_length].")
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
        cdef double batch_size = 1
        check_result(OgaGeneratorParamsGetSearchNumber(params._ptr, b"batch_size", &batch_size))
        with nogil:
            result = OgaCreateGenerator(model._ptr, params._ptr, &generator)
        if result == NULL:
            self._ptr = generator  # released by __dealloc__ if an interruption is raised below
        _check_callbacks(result)
        self._batch_size = <size_t>batch_size

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
        view = _generator_tokens(tokens, self._batch_size)
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

    def get_sequence(self, index):
        """OgaGenerator_GetSequenceData: a copy of sequence `index` as an int32 array."""
        cdef size_t count
        cdef const int32_t* data
        cdef size_t c_index = _size_t(index, "index")
        self._alive()
        data = OgaGenerator_GetSequenceData(self._ptr, c_index)
        if data == NULL:
            raise IndexError(f"Sequence index {index} is out of range.")
        count = OgaGenerator_GetSequenceCount(self._ptr, c_index)
        return _copy_array(data, count, _INT32)

    def get_next_tokens(self):
        """OgaGenerator_GetNextTokens: a copy of the last token of every sequence."""
        cdef const int32_t* data = NULL
        cdef size_t count = 0
        self._alive()
        check_result(OgaGenerator_GetNextTokens(self._ptr, &data, &count))
        return _copy_array(data, count, _INT32)

    def rewind_to(self, new_length):
        """OgaGenerator_RewindTo (GIL released)."""
        cdef c_OgaResult* result
        cdef size_t c_length = _size_t(new_length, "new_length")
        self._alive()
        with nogil:
            result = OgaGenerator_RewindTo(self._ptr, c_length)
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
                                               OgaElementType_float32, &tensor))
        try:
            with nogil:
                result = OgaGenerator_SetLogits(self._ptr, tensor)
            _check_callbacks(result)
        finally:
            OgaDestroyTensor(tensor)

    def set_runtime_option(self, str key not None, str value not None):
        """OgaGenerator_SetRuntimeOption: terminate_session "1" / "0" (any thread)."""
        self._alive()
        check_result(OgaGenerator_SetRuntimeOption(self._ptr, key.encode("utf-8"), value.encode("utf-8")))

    def get_speculative_stats(self):
        """OgaGenerator_GetSpeculativeStats, read into a dict (keys as in onnxruntime-genai 0.18)."""
        cdef c_OgaSpeculativeStats* stats = NULL
        self._alive()
        check_result(OgaGenerator_GetSpeculativeStats(self._ptr, &stats))
        return _speculative_stats_dict(stats)

    def get_input(self, str name not None):
        """OgaGenerator_GetInput: not supported by oga (raises)."""
        cdef c_OgaTensor* tensor = NULL
        self._alive()
        check_result(OgaGenerator_GetInput(self._ptr, name.encode("utf-8"), &tensor))

    def get_output(self, str name not None):
        """OgaGenerator_GetOutput: not supported by oga (raises)."""
        cdef c_OgaTensor* tensor = NULL
        self._alive()
        check_result(OgaGenerator_GetOutput(self._ptr, name.encode("utf-8"), &tensor))

    def set_inputs(self, named_tensors):
        """OgaGenerator_SetInputs: not supported by oga (raises)."""
        self._alive()
        check_result(OgaGenerator_SetInputs(self._ptr, NULL))

    def set_model_input(self, str name not None, value):
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

    def set_active_adapter(self, adapters, str adapter_name not None):
        """LoRA adapters (og.Adapters) are not supported by oga (raises NotImplementedError)."""
        from .unsupported import not_supported
        raise not_supported("Generator.set_active_adapter", "LoRA adapters loaded for a model")
