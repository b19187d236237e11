# Part of oga/_core.pyx (included there; compiled as one module).

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
