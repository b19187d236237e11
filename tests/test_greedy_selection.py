"""Greedy token selection over crafted logits rows (src/sampling/first_max.cpp: block maxima in one
vectorized pass, AVX2 or SSE2 by CPU, then the winning block again): the first index of the largest
value, NaN never chosen, ties broken toward the lowest index across vector lanes, blocks of 1024 and
the scalar tail, a masked EOS skipped for the next occurrence of the maximum or the next best value;
and from block maxima the executor hands over (OgaExtStepOutputs.logits_block_maxima, what
oga.LogitsHead computes): the same answers from the maxima and the winning block alone. A Python
executor (tests/test_executor_interface.py) returns each row as the step's logits; the engine's first
token is compared with numpy's answer."""
import ctypes
import json
from ctypes import byref, c_int32, c_uint64

import numpy as np
import pytest

from capi import Handles, P, error, lib, ok  # noqa: F401 (lib is a fixture)
from test_executor_interface import PyExecutor

VOCAB = 1003  # not a multiple of 16: the last 11 entries take the scalar tail
WIDE = 3003  # two blocks of 1024 and a partial third, whose last 3 entries take the scalar tail
EOS = 1


BLOCK = 1024  # OGA_EXT_LOGITS_BLOCK


def block_maxima(row):
    """Each block's largest value, NaN ignored, -inf when none exceeds -inf (the contract of
    OgaExtStepOutputs.logits_block_maxima)."""
    row = np.asarray(row, dtype=np.float32)
    padded = np.full(-(-len(row) // BLOCK) * BLOCK, -np.inf, dtype=np.float32)
    padded[:len(row)] = np.where(np.isnan(row), -np.inf, row)
    return padded.reshape(-1, BLOCK).max(axis=1)


class RowExecutor(PyExecutor):
    """Every step's logits are `row` (one row per request), with `maxima` as every row's block maxima
    when given (`stride` floats apart: at least its length unless a test wants a bad one)."""

    def __init__(self, row, maxima=None, stride=None):
        super().__init__(vocab=len(row))
        self.row = np.ascontiguousarray(row, dtype=np.float32)
        self.maxima = None if maxima is None else np.ascontiguousarray(maxima, dtype=np.float32)
        self.maxima_stride = len(self.maxima) if stride is None and maxima is not None else stride

    def _execute_inner(self, engine_data, inputs, outputs, message, capacity):
        rows = inputs.contents.num_rows
        self.logits = np.tile(self.row, (rows, 1))
        o = outputs.contents
        o.logits = self.logits.ctypes.data
        o.logits_type = 0
        o.logits_rows = rows
        o.logits_row_stride = len(self.row)
        o.logits_on_device = 0
        if self.maxima is not None:
            self.maxima_rows = np.tile(self.maxima, (rows, 1))
            o.logits_block_maxima = self.maxima_rows.ctypes.data
            o.logits_block_maxima_stride = self.maxima_stride
        return 0


def _engine(lib, ex):
    """An engine over `ex` (Handles, and the executor table, which must outlive the engine)."""
    config = json.dumps({
        "model": {"type": "python_test", "vocab_size": ex.vocab, "context_length": 64, "eos_token_id": EOS,
                  "bos_token_id": 0, "pad_token_id": 0, "decoder": {}},
        "search": {"max_length": 64, "do_sample": False},
        "engine": {"dynamic_batching": {"block_size": 4, "num_blocks": 32, "max_batch_size": 2}},
    }).encode()
    table = ex.table()
    model = P()
    ok(lib, lib.OgaExtCreateModelWithExecutor(config, ctypes.addressof(table), byref(model)))
    h = Handles(lib, model)
    lib.OgaDestroyModel(model)
    return h, table


def _first_token(lib, row, mask_eos=False, maxima=None, stride=None):
    ex = RowExecutor(row, maxima, stride)
    h, _table = _engine(lib, ex)
    request = h.request()
    options = P()
    ok(lib, lib.OgaRequestCreateTurnOptions(request, byref(options)))
    ok(lib, lib.OgaTurnOptionsSetMaxGeneratedTokens(options, 1))
    if mask_eos:
        ok(lib, lib.OgaTurnOptionsSetMinGeneratedTokens(options, 1))
    prompt = (c_int32 * 3)(5, 9, 13)
    turn = c_uint64()
    ok(lib, lib.OgaRequestBeginTurn(request, options, prompt, 3, byref(turn)))
    lib.OgaDestroyTurnOptions(options)
    buffer = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buffer)))
    events = h.drain(buffer)
    assert ex.error is None, ex.error
    lib.OgaDestroyEngineEventBuffer(buffer)
    lib.OgaDestroyRequest(request)
    h.destroy()
    tokens = [e[2] for _, e in events if e[2] is not None]
    if not tokens and [e[3] for _, e in events] == [1]:  # FinishReason EOS: the EOS token is not an event
        return EOS
    assert len(tokens) == 1, events
    return tokens[0]


def _expected(row, mask_eos=False):
    row = np.array(row, dtype=np.float32)
    if mask_eos:
        row[EOS] = -np.inf
    return int(np.nanargmax(row))  # the first occurrence of the largest non-NaN value


def _rows():
    rng = np.random.default_rng(11)
    rows = {}
    rows["random"] = rng.standard_normal(VOCAB)
    tie = rng.standard_normal(VOCAB)
    for index in (997, 300, 301, 17):  # the tail, two lanes of one vector, an early lane
        tie[index] = 9.0
    rows["ties across lanes and the tail"] = tie
    late = rng.standard_normal(VOCAB)
    late[1000] = 7.0  # only in the scalar tail
    rows["maximum in the tail"] = late
    nans = rng.standard_normal(VOCAB)
    nans[[0, 16, 33, 500, 1002]] = np.nan
    nans[640] = 5.0
    rows["NaN ignored"] = nans
    zeros = np.full(VOCAB, -1.0)
    zeros[[40, 8]] = [0.0, -0.0]  # -0.0 == 0.0: the lower index
    rows["signed zeros"] = zeros
    infinite = np.full(VOCAB, -np.inf)
    infinite[[900, 12]] = [np.inf, np.inf]
    rows["infinities"] = infinite
    return rows


def _wide_rows():
    rng = np.random.default_rng(12)
    rows = {}
    tie = rng.standard_normal(WIDE)
    tie[[2050, 1030, 2999]] = 8.0  # the second block's wins over the third block's and the tail's
    rows["ties across blocks"] = tie
    last = rng.standard_normal(WIDE)
    last[3001] = 7.0
    rows["maximum in the last block's tail"] = last
    nans = rng.standard_normal(WIDE)
    nans[[0, 1023, 1024, 2047, 3002]] = np.nan  # NaN at every block edge
    nans[1500] = 5.0
    rows["NaN at block edges ignored"] = nans
    zeros = np.full(WIDE, -2.0)
    zeros[[2500, 1500]] = [0.0, -0.0]
    rows["signed zeros across blocks"] = zeros
    lower = rng.standard_normal(WIDE)
    lower[5] = 6.0
    lower[2100] = 6.5  # a later block strictly greater
    rows["a later block strictly greater"] = lower
    nothing = np.full(WIDE, -np.inf)
    nothing[[7, 2048]] = np.nan
    nothing[1100] = -1e30
    rows["one finite value among -inf and NaN"] = nothing
    return rows


@pytest.mark.parametrize("name", list(_rows()))
def test_greedy_picks_the_first_largest_value(lib, name):
    row = _rows()[name]
    assert _first_token(lib, row) == _expected(row)


@pytest.mark.parametrize("name", list(_wide_rows()))
def test_greedy_picks_the_first_largest_value_over_several_blocks(lib, name):
    row = _wide_rows()[name]
    assert _first_token(lib, row) == _expected(row)


def test_a_masked_eos_at_the_maximum_yields_its_next_occurrence(lib):
    row = np.random.default_rng(3).standard_normal(VOCAB)
    row[[EOS, 620]] = 6.0
    assert _first_token(lib, row, mask_eos=True) == 620
    assert _first_token(lib, row) == EOS  # unmasked: the turn ends on it


def test_a_masked_eos_alone_at_the_maximum_yields_the_next_best(lib):
    row = np.random.default_rng(4).standard_normal(VOCAB)
    row[EOS] = 6.0
    row[333] = 5.5
    assert _first_token(lib, row, mask_eos=True) == _expected(row, mask_eos=True) == 333


@pytest.mark.parametrize("name", list(_rows()) + list(_wide_rows()))
def test_greedy_from_block_maxima_picks_the_first_largest_value(lib, name):
    row = {**_rows(), **_wide_rows()}[name]
    assert _first_token(lib, row, maxima=block_maxima(row)) == _expected(row)


def test_greedy_from_block_maxima_reads_the_maxima_not_the_whole_row(lib):
    """The maxima decide the block: a row whose largest value sits in block 0, with maxima that name
    block 2's own largest value, yields block 2's (what shows that the row is not read again).
    Reading them is the executor's promise (oga.LogitsHead computes them from the row it writes)."""
    row = np.random.default_rng(5).standard_normal(WIDE)
    row[100], row[2500] = 9.0, 4.0
    told = block_maxima(row)
    told[0] = 1.0
    assert _first_token(lib, row, maxima=told) == 2500
    assert _first_token(lib, row, maxima=block_maxima(row)) == 100


def test_block_maxima_no_value_of_the_block_matches_fall_back_to_the_whole_row(lib):
    """A winning block that holds no value equal to its maximum: the maxima do not describe this
    row, so the engine scans it all (never past the block, never a wrong answer from a bad table)."""
    row = np.random.default_rng(6).standard_normal(WIDE)
    row[2999] = 8.0
    assert _first_token(lib, row, maxima=[0.5, 123.0, 0.25]) == 2999


def test_a_masked_eos_at_the_maximum_with_block_maxima(lib):
    row = np.random.default_rng(7).standard_normal(WIDE)
    row[[EOS, 2620]] = 6.0
    row[1500] = 5.5
    assert _first_token(lib, row, mask_eos=True, maxima=block_maxima(row)) == 2620
    row[2620] = 0.0
    assert _first_token(lib, row, mask_eos=True, maxima=block_maxima(row)) == 1500


def test_block_maxima_with_too_short_a_row_stride_are_refused(lib):
    """Fewer than ceil(vocab / 1024) maxima per row: the step fails as an executor contract breach
    (the engine is unhealthy, with a message naming the maxima), before any token is chosen."""
    row = np.random.default_rng(8).standard_normal(WIDE)
    ex = RowExecutor(row, block_maxima(row), stride=2)
    h, _table = _engine(lib, ex)
    request = h.request()
    prompt = (c_int32 * 3)(5, 9, 13)
    turn = c_uint64()
    ok(lib, lib.OgaRequestBeginTurn(request, None, prompt, 3, byref(turn)))
    buffer = P()
    ok(lib, lib.OgaCreateEngineEventBuffer(h.engine, 4, byref(buffer)))
    ok(lib, lib.OgaEngineRun(h.engine, buffer))
    events = [h.read_event(lib.OgaEngineEventBufferGet(buffer, i))
              for i in range(lib.OgaEngineEventBufferGetCount(buffer))]
    assert events and all(e[2] is None for _, e in events), events  # the turn failed without a token
    assert error(lib, lib.OgaEngineRun(h.engine, buffer)) == (
        "Model execution failed and the Engine is no longer healthy. Cause: the executor returned logits block "
        "maxima of stride 2; expected host float32 logits and at least 3 maxima per row")
    lib.OgaDestroyEngineEventBuffer(buffer)
    lib.OgaDestroyRequest(request)
    h.destroy()


def test_the_sse2_loop_agrees(tmp_path):
    """OGA_SAMPLER_PORTABLE=1 selects the SSE2 loop (the x86-64 baseline): the same tests, in a
    process of their own (the choice is made once per process)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, OGA_SAMPLER_PORTABLE="1")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                             "-k", "not sse2"], cwd=os.path.dirname(os.path.dirname(__file__)), env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "30 passed" in result.stdout, result.stdout

