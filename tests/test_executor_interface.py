"""The C-level model-executor interface (OgaExtCreateModelWithExecutor), driven by a Python executor
through ctypes: it keeps its own paged token store addressed through the engine's block tables, so
streams match the oracle only if the engine packs steps correctly. Also covers classified failures
reported by an executor and the callback lifecycle."""

import ctypes
import json
from ctypes import POINTER, Structure, byref, c_bool, c_int32, c_int64, c_size_t, c_uint32, c_void_p

import numpy as np
import pytest

from capi import Handles, P, error, lib, ok  # noqa: F401 (lib is a fixture)
from helpers import (
    E_EXECUTION, E_RETRYABLE, FAILED, R_FAILED, RETRYABLE, STATE_INIT, TURN_FINISHED, OracleSequence,
    expected_turn_events, next_state, scores,
)


class Geometry(Structure):
    _fields_ = [(n, c_size_t) for n in ("block_size", "num_blocks", "max_batch_size", "max_scheduled_tokens",
                                        "max_block_table_columns", "vocab_size", "max_sequence_length",
                                        "window_ring_blocks", "window_blocks", "fixed_state_slots")]


class StepInputs(Structure):
    _fields_ = [
        ("num_rows", c_size_t), ("num_tokens", c_size_t),
        ("input_ids", POINTER(c_int64)), ("position_ids", POINTER(c_int64)),
        ("cumulative_sequence_lengths", POINTER(c_int32)), ("past_sequence_lengths", POINTER(c_int32)),
        ("block_table", POINTER(c_int32)), ("block_table_columns", c_size_t),
        ("attention_metadata", POINTER(c_int32)), ("logits_indices", POINTER(c_int32)),
        ("graph_eligible", c_int32), ("block_table_windowed", POINTER(c_int32)),
        ("num_fixed_states", c_size_t), ("fixed_state_inputs", POINTER(c_void_p)),
        ("fixed_state_outputs", POINTER(c_void_p)), ("fixed_state_captures", POINTER(c_void_p)),
        ("fixed_state_direct", c_int32), ("graph_id", ctypes.c_int64),
    ]


class StepOutputs(Structure):
    _fields_ = [("logits", c_void_p), ("logits_type", c_uint32), ("logits_rows", c_size_t),
                ("logits_row_stride", c_size_t), ("logits_on_device", c_int32),
                ("logits_block_maxima", c_void_p), ("logits_block_maxima_stride", c_size_t)]


OPEN = ctypes.CFUNCTYPE(c_uint32, c_void_p, POINTER(Geometry), POINTER(c_void_p), c_void_p, c_size_t)
EXECUTE = ctypes.CFUNCTYPE(c_uint32, c_void_p, POINTER(StepInputs), POINTER(StepOutputs), c_void_p, c_size_t)
CLOSE = ctypes.CFUNCTYPE(None, c_void_p)
RELEASE = ctypes.CFUNCTYPE(None, c_void_p)


class Executor(Structure):
    _fields_ = [("per_token_logits", c_int32), ("max_block_table_columns", c_size_t), ("bytes_per_block", c_size_t),
                ("model_data", c_void_p),
                ("open_engine", OPEN), ("execute", EXECUTE), ("close_engine", CLOSE), ("release_model", RELEASE),
                ("execute_static", c_void_p), ("windowed_block_table", c_int32),
                ("bytes_per_window_block", c_size_t), ("num_fixed_states", c_size_t),
                ("fixed_state_row_bytes", POINTER(c_size_t)), ("fixed_state_capture", c_int32),
                ("cuda_graph", c_int32), ("device_ops", c_void_p)]


class PyExecutor:
    """Python twin of the built-in test executor."""

    def __init__(self, vocab=64, per_token=False, script=None, stride_pad=0):
        self.vocab = vocab
        self.per_token = per_token
        self.script = dict(script or {})  # call index -> (status, message)
        self.stride = vocab + stride_pad
        self.logits_on_device = 0
        self.calls = 0
        self.opened = []
        self.closed = 0
        self.closed_engine_data = []    # what each close got back: the engine_data open stored
        self.released = 0
        self.steps = []
        self.logits = None
        self.error = None
        self.c_open = OPEN(self._open)
        self.c_execute = EXECUTE(self._execute)
        self.c_close = CLOSE(self._close)
        self.c_release = RELEASE(self._release)

    def table(self):
        return Executor(int(self.per_token), 0, 0, None, self.c_open, self.c_execute, self.c_close, self.c_release)

    def _open(self, model_data, geometry, engine_data, message, capacity):
        g = geometry.contents
        self.geometry = {n: getattr(g, n) for n, _ in Geometry._fields_}
        self.store = {}
        self.opened.append(self.geometry)
        engine_data[0] = 1234
        return 0

    def _close(self, engine_data):
        # recorded, not asserted here: an assertion inside a ctypes callback only warns
        self.closed_engine_data.append(engine_data)
        self.closed += 1

    def _release(self, model_data):
        self.released += 1

    def _execute(self, engine_data, inputs, outputs, message, capacity):
        try:
            return self._execute_inner(engine_data, inputs, outputs, message, capacity)
        except Exception as exc:  # noqa: BLE001
            self.error = exc
            return 3

    def _execute_inner(self, engine_data, inputs, outputs, message, capacity):
        index = self.calls
        self.calls += 1
        if index in self.script:
            status, text = self.script[index]
            data = text.encode()[: capacity - 1] + b"\0"
            ctypes.memmove(message, data, len(data))
            return status
        x = inputs.contents
        rows, n = x.num_rows, x.num_tokens
        ids = [x.input_ids[i] for i in range(n)]
        cum = [x.cumulative_sequence_lengths[i] for i in range(rows + 1)]
        past = [x.past_sequence_lengths[i] for i in range(rows)]
        cols = x.block_table_columns
        bt = [[x.block_table[r * cols + c] for c in range(cols)] for r in range(rows)]
        lidx = [x.logits_indices[i] for i in range(rows)]
        md = [x.attention_metadata[i] for i in range(3)]
        self.steps.append(dict(ids=ids, cum=cum, past=past, bt=bt, lidx=lidx, md=md, graph=x.graph_eligible))
        bs = self.geometry["block_size"]
        states = []
        for r in range(rows):
            for j in range(cum[r + 1] - cum[r]):
                pos = past[r] + j
                tok = ids[cum[r] + j]
                if pos == 0:
                    prev = STATE_INIT
                else:
                    prev_slot = bt[r][(pos - 1) // bs] * bs + (pos - 1) % bs
                    stored = self.store.get(prev_slot)
                    if stored is None or stored[0] != pos - 1:
                        raise AssertionError(f"slot {prev_slot} does not hold position {pos - 1}")
                    prev = stored[1]
                state = next_state(prev, tok, pos)
                blk = bt[r][pos // bs]
                assert blk >= 0
                self.store[blk * bs + pos % bs] = (pos, state)
                states.append(state)
        chosen = states if self.per_token else [states[i] for i in lidx]
        logits = np.zeros((len(chosen), self.stride), dtype=np.float32)
        for i, s in enumerate(chosen):
            logits[i, : self.vocab] = scores(s, self.vocab).astype(np.float64) / float(1 << 24) * 8.0 - 4.0
        self.logits = logits
        o = outputs.contents
        o.logits = logits.ctypes.data
        o.logits_type = 0
        o.logits_rows = len(chosen)
        o.logits_row_stride = self.stride
        o.logits_on_device = self.logits_on_device
        return 0


def model_config(**dyn):
    d = {"block_size": 4, "num_blocks": 64, "max_batch_size": 4}
    d.update(dyn)
    return json.dumps({
        "model": {"type": "python_test", "vocab_size": 64, "context_length": 128, "eos_token_id": 1,
                  "bos_token_id": 0, "pad_token_id": 0, "decoder": {}},
        "search": {"max_length": 128, "do_sample": False},
        "engine": {"dynamic_batching": d},
    }).encode()


def make(lib, ex, **dyn):
    table = ex.table()
    model = P()
    ok(lib, lib.OgaExtCreateModelWithExecutor(model_config(**dyn), ctypes.addressof(table), byref(model)))
    h = Handles(lib, model)
    lib.OgaDestroyModel(model)
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 16, byref(buf)))
    return h, buf


def collect(h, buf, reqs):
    by = {}
    for req_ptr, ev in h.drain(buf):
        by.setdefault(req_ptr, []).append(ev)
    return [by.get(r.value, []) for r in reqs]


PROMPTS = [[5, 9, 13], [7, 7], list(range(10, 21))]


@pytest.mark.parametrize("per_token", [False, True])
def test_python_executor_reproduces_the_oracle(lib, per_token):
    ex = PyExecutor(per_token=per_token)
    h, buf = make(lib, ex, max_scheduled_tokens=6)
    assert ex.opened == [dict(block_size=4, num_blocks=64, max_batch_size=4, max_scheduled_tokens=6,
                              max_block_table_columns=ex.opened[0]["max_block_table_columns"], vocab_size=64,
                              max_sequence_length=0, window_ring_blocks=0, window_blocks=0,
                              fixed_state_slots=0)]
    reqs = [h.request() for _ in PROMPTS]
    for r, p in zip(reqs, PROMPTS):
        h.begin(r, p, max_gen=5)
    got = collect(h, buf, reqs)
    assert ex.error is None, ex.error
    for g, p in zip(got, PROMPTS):
        toks, reason = OracleSequence().turn(p, max_gen=5)
        assert g == expected_turn_events(1, len(p), toks, reason)
    # Continuation through the same executor.
    h.begin(reqs[0], [4, 4], max_gen=3)
    got = collect(h, buf, reqs[:1])[0]
    oracle = OracleSequence()
    oracle.turn(PROMPTS[0], max_gen=5)
    toks, reason = oracle.turn([4, 4], max_gen=3)
    assert got == expected_turn_events(2, 2, toks, reason)
    assert all(sum(s["cum"][-1:]) <= 6 for s in ex.steps)
    for r in reqs:
        lib.OgaDestroyRequest(r)
    assert ex.closed == 0 and ex.closed_engine_data == []
    h.destroy()
    assert ex.closed == 1 and ex.closed_engine_data == [1234]
    assert ex.released == 1


def test_logits_row_stride_is_honoured(lib):
    ex = PyExecutor(stride_pad=7)
    h, buf = make(lib, ex)
    r = h.request()
    h.begin(r, [5, 9, 13], max_gen=4)
    got = collect(h, buf, [r])[0]
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=4)
    assert got == expected_turn_events(1, 3, toks, reason)
    lib.OgaDestroyRequest(r)
    h.destroy()


def test_executor_retryable_and_capacity_statuses(lib):
    ex = PyExecutor(script={1: (1, "try again"), 3: (2, "out of memory")})
    h, buf = make(lib, ex)
    r = h.request()
    h.begin(r, [5, 9, 13], max_gen=4)
    events = h.drain(buf)
    engine_events = [e for req, e in events if req is None]
    assert engine_events == [(RETRYABLE, 0, None, 0, E_RETRYABLE, (0, 0, 0)), (4, 0, None, 0, 2, (0, 0, 0))]
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=4)
    assert [e for req, e in events if req is not None] == expected_turn_events(1, 3, toks, reason)
    assert ex.calls == 6
    lib.OgaDestroyRequest(r)
    h.destroy()


def test_executor_fatal_status_poisons_with_its_message(lib):
    ex = PyExecutor(script={2: (3, "device lost")})
    h, buf = make(lib, ex)
    a, b = h.request(), h.request()
    h.begin(a, [5, 9, 13], max_gen=10)
    h.begin(b, [7, 7], max_gen=10)
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    n = lib.OgaEngineEventBufferGetCount(buf)
    evs = [h.read_event(lib.OgaEngineEventBufferGet(buf, i)) for i in range(n)]
    assert sorted(e for _, e in evs) == [(TURN_FINISHED | FAILED, 1, None, R_FAILED, E_EXECUTION, (2, 2, 0)),
                                         (TURN_FINISHED | FAILED, 1, None, R_FAILED, E_EXECUTION, (3, 2, 0))]
    assert error(lib, lib.OgaEngineRun(h.engine, buf)) == \
        "Model execution failed and the Engine is no longer healthy. Cause: device lost"
    pending = c_bool(True)
    ok(lib, lib.OgaEngineHasPendingRequests(h.engine, byref(pending)))
    assert pending.value is False
    ok(lib, lib.OgaRequestClose(a))
    lib.OgaDestroyRequest(a)
    lib.OgaDestroyRequest(b)
    h.destroy()
    assert ex.closed == 1


def test_device_logits_without_a_device_read_are_fatal(lib):
    ex = PyExecutor()
    ex.logits_on_device = 1  # and no OgaExtDeviceOps: the engine cannot see such logits
    h, buf = make(lib, ex)
    r = h.request()
    h.begin(r, [5, 9, 13], max_gen=4)
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    assert error(lib, lib.OgaEngineRun(h.engine, buf)) == (
        "Model execution failed and the Engine is no longer healthy. Cause: the executor returned device logits, "
        "but its OgaExtDeviceOps has no read operation")
    lib.OgaDestroyRequest(r)
    h.destroy()


def test_executor_returning_wrong_row_count_is_fatal(lib):
    ex = PyExecutor(per_token=False)
    table = ex.table()
    table.per_token_logits = 1  # claims per-token rows but returns one row per request
    model = P()
    ok(lib, lib.OgaExtCreateModelWithExecutor(model_config(), ctypes.addressof(table), byref(model)))
    h = Handles(lib, model)
    lib.OgaDestroyModel(model)
    buf = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buf)))
    r = h.request()
    h.begin(r, [5, 9, 13])
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    _, ev = h.read_event(lib.OgaEngineEventBufferGet(buf, 0))
    assert ev[0] == TURN_FINISHED | FAILED and ev[4] == E_EXECUTION
    msg = error(lib, lib.OgaEngineRun(h.engine, buf))
    assert msg.startswith("Model execution failed and the Engine is no longer healthy. Cause: ")
    lib.OgaDestroyRequest(r)
    h.destroy()


def test_model_creation_validates_the_executor_table(lib):
    model = P()
    assert error(lib, lib.OgaExtCreateModelWithExecutor(model_config(), None, byref(model))) == \
        "executor must not be null."
    ex = PyExecutor()
    table = ex.table()
    assert error(lib, lib.OgaExtCreateModelWithExecutor(None, ctypes.addressof(table), byref(model)))
    assert ex.released == 1, "model_data belongs to the model from the call on, also on failure"
    assert error(lib, lib.OgaExtCreateModelWithExecutor(b"{not json", ctypes.addressof(table), byref(model)))
    assert ex.released == 2
    assert model.value is None


def test_fault_injection_requires_a_test_model(lib):
    ex = PyExecutor()
    table = ex.table()
    model = P()
    ok(lib, lib.OgaExtCreateModelWithExecutor(model_config(), ctypes.addressof(table), byref(model)))
    assert error(lib, lib.OgaExtTestModelInjectFault(model, 2, 1, 0, 1)) == "Fault injection requires a test model."
    lib.OgaDestroyModel(model)
    assert ex.released == 1


def test_release_model_waits_for_the_last_engine(lib):
    ex = PyExecutor()
    table = ex.table()
    model = P()
    ok(lib, lib.OgaExtCreateModelWithExecutor(model_config(), ctypes.addressof(table), byref(model)))
    h1 = Handles(lib, model)
    h2 = Handles(lib, model)
    lib.OgaDestroyModel(model)
    assert len(ex.opened) == 2 and ex.released == 0
    h1.destroy()
    assert ex.closed == 1 and ex.released == 0
    h2.destroy()
    assert ex.closed == 2 and ex.released == 1




@pytest.mark.parametrize("row_bytes,expected", [
    ([], "model.decoder.state_groups declares 2 fixed state bindings, but the model executor binds 0 fixed state "
         "tensors."),
    ([16], "model.decoder.state_groups declares 2 fixed state bindings, but the model executor binds 1 fixed state "
           "tensors."),
    ([16, 0], "A fixed decoder state tensor has an empty per-request row."),
])
def test_engine_checks_the_executors_fixed_state_against_the_manifest(lib, row_bytes, expected):
    ex = PyExecutor()
    table = ex.table()
    sizes = (c_size_t * max(1, len(row_bytes)))(*row_bytes)
    table.num_fixed_states = len(row_bytes)
    table.fixed_state_row_bytes = ctypes.cast(sizes, POINTER(c_size_t)) if row_bytes else None
    cfg = json.loads(model_config())
    cfg["model"]["decoder"] = {"num_hidden_layers": 2, "state_groups": [
        {"kind": "paged_kv", "layer_ids": [1]}, {"kind": "fixed_conv", "layer_ids": [0]},
        {"kind": "fixed_recurrent", "layer_ids": [0]}]}
    model = P()
    ok(lib, lib.OgaExtCreateModelWithExecutor(json.dumps(cfg).encode(), ctypes.addressof(table), byref(model)))
    engine = P()
    assert error(lib, lib.OgaCreateEngine(model, byref(engine))) == expected
    assert engine.value is None and ex.opened == []
    lib.OgaDestroyModel(model)


def test_an_executor_calling_back_in_cannot_change_the_live_step(lib):
    """An executor callback runs inside the engine's transaction: closing, beginning, cancelling or
    rewinding a request, or running the engine again, is refused there, and the step completes
    normally."""
    class Reentrant(PyExecutor):
        def _execute_inner(self, engine_data, inputs, outputs, message, capacity):
            if self.calls == 0:
                cancelled = ctypes.c_bool()
                self.refusals = [error(lib, lib.OgaRequestClose(self.victim)),
                                 error(lib, lib.OgaRequestCancelTurn(self.victim, 1, ctypes.byref(cancelled))),
                                 error(lib, lib.OgaEngineRun(self.engine, self.buffer))]
            return super()._execute_inner(engine_data, inputs, outputs, message, capacity)

    ex = Reentrant()
    h, buf = make(lib, ex)
    r = h.request()
    ex.victim = r
    ex.engine, ex.buffer = h.engine, buf
    h.begin(r, [5, 9, 13], max_gen=2)
    ok(lib, lib.OgaEngineRun(h.engine, buf))
    assert ex.error is None, ex.error
    assert ex.refusals == ["Cannot close a request while a step is in flight.",
                           "Cannot cancel a turn while a step is in flight.",
                           "Cannot run the engine while a step is in flight."]
    ok(lib, lib.OgaExtEngineCheckInvariants(h.engine))
    got = collect(h, buf, [r])
    assert got
    lib.OgaDestroyRequest(r)
    h.destroy()
