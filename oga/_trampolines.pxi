# Part of oga/_core.pyx (included there; compiled as one module).

# ---------------------------------------------------------------------------------------------
# The ONNX Runtime model loader (OgaExtModelLoader) and executor trampolines. The executor itself
# is oga/executor/; these functions only cross between the C callback table and Python. The Python
# modules they call are handed down by oga/__init__.py (_register_callbacks): _core imports none of
# the modules that import it.
# ---------------------------------------------------------------------------------------------

cdef object _executor_package = None  # oga.executor: load_decoder, native.requested, native.attach
cdef object _tokenizer_module = None  # oga.tokenizer: _engine_token_table, _engine_tokenize

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
        return OgaExtExecutionStatus_Interrupted
    try:
        text = f"{type(error).__name__}: {error}" if typed else error
    except BaseException as format_error:
        if _is_interruption(format_error):
            _defer_interruption(format_error)
        text = type(error).__name__
    _write_message(message, capacity, text)
    # An interruption that landed while the message was formatted still wins.
    return OgaExtExecutionStatus_Interrupted if _interruption_deferred() else status


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


_STATE_GROUP_KINDS = {OgaExtStateGroupKind_FixedConv: "fixed_conv", OgaExtStateGroupKind_FixedRecurrent: "fixed_recurrent"}


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
            native = _executor_package.native
            decoder = _executor_package.load_decoder(_decoder_names(names), native.requested())
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
            if native.attach(decoder, <size_t>executor):
                return OgaExtExecutionStatus_Ok
        except BaseException as error:
            status = _callback_failure(error, message, capacity, OgaExtExecutionStatus_Fatal, False)
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
        return OgaExtExecutionStatus_Ok


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
            return OgaExtExecutionStatus_CapacityExceeded
        except BaseException as error:
            return _callback_failure(error, message, capacity, OgaExtExecutionStatus_Fatal, False)
        Py_INCREF(engine)  # owned by the engine; released by close_engine
        engine_data[0] = <void*>engine
        return OgaExtExecutionStatus_Ok


@cython.final
cdef class StepInputs:
    """One packed step as the Python executor receives it (OgaExtStepInputs, include/oga/oga_ext.h):
    counts, and the addresses of the engine's arrays, which are valid only during the execute call
    that received them. `fixed_state`: one (input, output[, capture]) address tuple per fixed state
    tensor, or None without fixed state. Tests build one with keyword arguments."""
    cdef readonly size_t num_rows, num_tokens, block_table_columns
    cdef readonly uintptr_t input_ids, position_ids, cumulative_sequence_lengths, past_sequence_lengths
    cdef readonly uintptr_t block_table, attention_metadata, logits_indices, block_table_windowed
    cdef readonly object fixed_state
    cdef readonly int64_t graph_id

    def __init__(self, *, size_t num_rows, size_t num_tokens, uintptr_t input_ids, uintptr_t position_ids,
                 uintptr_t cumulative_sequence_lengths, uintptr_t past_sequence_lengths, uintptr_t block_table,
                 size_t block_table_columns, uintptr_t attention_metadata, uintptr_t logits_indices,
                 uintptr_t block_table_windowed=0, fixed_state=None, int64_t graph_id=-1):
        self.num_rows, self.num_tokens, self.block_table_columns = num_rows, num_tokens, block_table_columns
        self.input_ids, self.position_ids = input_ids, position_ids
        self.cumulative_sequence_lengths, self.past_sequence_lengths = cumulative_sequence_lengths, past_sequence_lengths
        self.block_table, self.attention_metadata = block_table, attention_metadata
        self.logits_indices, self.block_table_windowed = logits_indices, block_table_windowed
        self.fixed_state, self.graph_id = fixed_state, graph_id


cdef StepInputs _step_inputs(const OgaExtStepInputs* inputs):
    cdef StepInputs step = StepInputs.__new__(StepInputs)
    step.num_rows, step.num_tokens, step.block_table_columns = (inputs.num_rows, inputs.num_tokens,
                                                                inputs.block_table_columns)
    step.input_ids = <uintptr_t>inputs.input_ids
    step.position_ids = <uintptr_t>inputs.position_ids
    step.cumulative_sequence_lengths = <uintptr_t>inputs.cumulative_sequence_lengths
    step.past_sequence_lengths = <uintptr_t>inputs.past_sequence_lengths
    step.block_table = <uintptr_t>inputs.block_table
    step.attention_metadata = <uintptr_t>inputs.attention_metadata
    step.logits_indices = <uintptr_t>inputs.logits_indices
    step.block_table_windowed = <uintptr_t>inputs.block_table_windowed
    step.fixed_state = _fixed_state_bindings(inputs) if inputs.num_fixed_states > 0 else None
    step.graph_id = inputs.graph_id
    return step


cdef OgaExtExecutionStatus _onnx_execute(void* engine_data, const OgaExtStepInputs* inputs,
                                         OgaExtStepOutputs* outputs, char* message, size_t capacity) noexcept nogil:
    with gil:
        executor = <object>engine_data
        try:
            status, text, address, rows = executor.execute(_step_inputs(inputs))
            if status != 0:
                _write_message(message, capacity, text)
                return status
            outputs.logits = <const void*><size_t>address
            outputs.logits_type = executor.logits_type
            outputs.logits_rows = rows
            outputs.logits_row_stride = executor.vocab
            outputs.logits_on_device = 1 if executor.logits_on_device else 0
            outputs.logits_block_maxima = <const float*><size_t>executor.block_maxima_address
            outputs.logits_block_maxima_stride = executor.block_maxima_stride
        except BaseException as error:
            return _callback_failure(error, message, capacity, OgaExtExecutionStatus_Fatal)
        return OgaExtExecutionStatus_Ok


cdef OgaExtExecutionStatus _onnx_execute_static(void* engine_data, const OgaExtStaticStepInputs* inputs,
                                                OgaExtStepOutputs* outputs, char* message,
                                                size_t capacity) noexcept nogil:
    with gil:
        executor = <object>engine_data
        try:
            status, text, address, rows = executor.execute_static(
                inputs.batch_size, inputs.sequence_length, inputs.total_sequence_length, <size_t>inputs.input_ids,
                <size_t>inputs.attention_mask, <size_t>inputs.logits_positions, <size_t>inputs.position_ids,
                inputs.new_batch)
            if status != 0:
                _write_message(message, capacity, text)
                return status
            outputs.logits = <const void*><size_t>address
            outputs.logits_type = executor.logits_type
            outputs.logits_rows = rows
            outputs.logits_row_stride = executor.vocab
        except BaseException as error:
            return _callback_failure(error, message, capacity, OgaExtExecutionStatus_Fatal)
        return OgaExtExecutionStatus_Ok


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


# The token table the engine copies while the loader runs; kept until the next load.
cdef object _loaded_token_table = None


cdef OgaExtExecutionStatus _token_table_load(const char* directory, OgaExtTokenTable* table,
                                             char* message, size_t capacity) noexcept nogil:
    global _loaded_token_table
    with gil:
        try:
            blob, offsets, special = _tokenizer_module._engine_token_table(_text(directory))
            _loaded_token_table = (blob, offsets, special)
            _fill_token_table(table, blob, offsets, special)
            return OgaExtExecutionStatus_Ok
        except BaseException as error:
            return _callback_failure(error, message, capacity, OgaExtExecutionStatus_Fatal)


cdef size_t _tokenize(const char* directory, const uint8_t* data, size_t count, uint32_t* tokens,
                      size_t capacity) noexcept nogil:
    cdef size_t i
    with gil:
        try:
            ids = _tokenizer_module._engine_tokenize(_text(directory), (<const char*>data)[:count])
            n = len(ids)
            for i in range(min(<size_t>n, capacity)):
                tokens[i] = ids[i]
            return n
        except BaseException as error:
            if _is_interruption(error):
                _defer_interruption(error)
                return OgaExtTokenize_Interrupted
            return 0


def _register_callbacks(executor_package, tokenizer_module):
    """Called once by oga/__init__.py with oga.executor and oga.tokenizer: registers the model loader
    (OgaExtSetModelLoader), the token-table loader (OgaExtSetTokenTableLoader) and the tokenize
    function (OgaExtSetTokenizeFunction), whose trampolines call into those modules."""
    global _executor_package, _tokenizer_module
    _executor_package, _tokenizer_module = executor_package, tokenizer_module
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
