"""Hybrid decoders (short-convolution and linear-recurrent layers beside paged attention; seed
"Fixed request-state pools") on the Python side: the CPU graph builder, the numpy reference and the
ONNX executor's fixed-state bindings, driven directly with hand-made packed steps (no C++ engine;
tests/test_hybrid_engine.py and tests/test_hybrid_onnx_engine.py run hybrid models on it).

The test plays the engine's FixedStatePool: each sequence owns its committed state (zeros when
new); a step gathers the scheduled rows' states, in row order, into one contiguous input buffer
per fixed tensor, binds a distinct output buffer, and after the run takes each row's output as
that sequence's new committed state. With a per-token capture decoder (per_token_logits, the
`present.*.per_token` outputs) it also binds one persistent capture buffer per fixed tensor and keeps
each step's captured per-token states, as the engine's draft verification does.
"""
import json
import os

import numpy as np
import onnx
import pytest

from model_dirs import decoder_names
import oga as og
from oga import executor as executors
from oga._core import StepInputs
from oga import testing
from oga.models import build
from oga.models.random_weights import random_model, tiny_spec
from oga.models.reference import Reference, forward_with_states

BLOCK = 4
TOL = 1e-4
TYPES = ["conv", "attention", "recurrent", "attention"]


def hybrid_spec(layer_types=TYPES, **overrides):
    fields = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=len(layer_types), num_heads=4,
                  num_kv_heads=2, head_dim=8, context_length=256, layer_types=list(layer_types), conv_kernel=4)
    fields.update(overrides)
    return tiny_spec(**fields)


class HybridSteps:
    """Packs rows into the buffers OgaExtStepInputs describes, stages fixed state per row, and
    calls OnnxEngineExecutor.execute with addresses. Blocks come scattered from one NaN-filled pool."""

    def __init__(self, model_dir, max_batch_size=6, num_blocks=64, seed=0):
        self.decoder = executors.load_decoder(decoder_names(model_dir))
        self.block_size = self.decoder.names["block_size"]
        self.geometry = {
            "block_size": self.block_size, "num_blocks": num_blocks, "max_batch_size": max_batch_size,
            "max_scheduled_tokens": 128, "max_block_table_columns": num_blocks,
            "vocab_size": self.decoder.names["vocab_size"], "max_sequence_length": 0}
        self.executor = self.decoder.open_engine(self.geometry)
        for cache in self.executor.caches:
            cache.fill(np.nan)
        self.free = [int(b) for b in np.random.default_rng(seed).permutation(num_blocks)]
        self.blocks, self.length = {}, {}
        self.states = {}   # sequence -> [committed state per fixed tensor]
        # capture decoders: one [max_scheduled_tokens, *row] buffer per fixed tensor, reused by every
        # step at the same address (so the executor must rebind it when the token count changes)
        self.captures = None
        if self.decoder.fixed_state_capture:
            self.captures = [np.zeros((self.geometry["max_scheduled_tokens"],) + t.row_shape, t.dtype)
                             for t in self.decoder.fixed_states]
        self.captured = None   # the last step's per-token states: [num_tokens, *row] per fixed tensor
        self.presents = None   # the last step's outputs: [num_rows, *row] per fixed tensor

    def state(self, name):
        return self.states.setdefault(name, [np.zeros(t.row_shape, t.dtype) for t in self.decoder.fixed_states])

    def pack(self, rows):
        ids, cu, past, tables = [], [0], [], []
        for name, tokens in rows:
            start = self.length.get(name, 0)
            table = self.blocks.setdefault(name, [])
            while len(table) * self.block_size < start + len(tokens):
                table.append(self.free.pop())
            ids += list(tokens)
            cu.append(cu[-1] + len(tokens))
            past.append(start)
            tables.append(table)
        columns = max(len(t) for t in tables)
        block_table = np.full((len(rows), columns), -1, np.int32)
        for r, table in enumerate(tables):
            block_table[r, :len(table)] = table
        q = np.diff(cu)
        total = max(p + n for p, n in zip(past, q))
        return dict(input_ids=np.asarray(ids, np.int64), position_ids=np.zeros(len(ids), np.int64),
                    cu=np.asarray(cu, np.int32), past=np.asarray(past, np.int32), block_table=block_table,
                    metadata=np.asarray([q.max(), total, total], np.int32),
                    logits_indices=np.asarray(np.asarray(cu[1:]) - 1, np.int32)), columns

    def run(self, rows, arrays, columns, fixed_state):
        a = {k: v.ctypes.data for k, v in arrays.items()}
        return self.executor.execute(StepInputs(
            num_rows=len(rows), num_tokens=len(arrays["input_ids"]), input_ids=a["input_ids"],
            position_ids=a["position_ids"], cumulative_sequence_lengths=a["cu"], past_sequence_lengths=a["past"],
            block_table=a["block_table"], block_table_columns=columns, attention_metadata=a["metadata"],
            logits_indices=a["logits_indices"], fixed_state=fixed_state))

    def step(self, rows):
        """rows: [(sequence, new tokens)]; returns the logits rows (a copy) and commits the states."""
        arrays, columns = self.pack(rows)
        ins = [np.ascontiguousarray(np.stack([self.state(name)[j] for name, _ in rows]))
               for j in range(len(self.decoder.fixed_states))]
        outs = [np.full_like(x, np.nan) for x in ins]
        entries = [(i.ctypes.data, o.ctypes.data) for i, o in zip(ins, outs)]
        if self.captures is not None:
            for c in self.captures:
                c.fill(np.nan)
            entries = [e + (c.ctypes.data,) for e, c in zip(entries, self.captures)]
        status, message, address, count = self.run(rows, arrays, columns, entries)
        assert status == executors.STATUS_OK, message
        assert address == self.executor.logits.ctypes.data
        self.presents = [o.copy() for o in outs]
        if self.captures is not None:
            num_tokens = len(arrays["input_ids"])
            self.captured = [c[:num_tokens].copy() for c in self.captures]
            assert all(np.isnan(c[num_tokens:]).all() for c in self.captures)   # bound at num_tokens rows
        for name, tokens in rows:
            self.length[name] = self.length.get(name, 0) + len(tokens)
        for r, (name, _) in enumerate(rows):
            self.states[name] = [o[r].copy() for o in outs]
        return self.executor.logits[:count].copy()


def _tokens(rng, n, vocab=97):
    return [int(t) for t in rng.integers(0, vocab, n)]


def _schedule(rng):
    """Three prompts (19, 11 and 6 tokens) prefilled in chunks alongside each other's decodes, rows
    in a different order from step to step, then decodes; a fourth sequence joins late."""
    a, b, c, d = _tokens(rng, 19), _tokens(rng, 11), _tokens(rng, 6), _tokens(rng, 9)
    steps = [
        [("a", a[:7]), ("b", b[:5])],
        [("b", b[5:11]), ("a", a[7:12]), ("c", c[:2])],
        [("c", c[2:6]), ("a", a[12:19])],
        [("a", _tokens(rng, 1)), ("c", _tokens(rng, 1)), ("b", _tokens(rng, 1))],
        [("b", _tokens(rng, 1)), ("d", d[:5]), ("a", _tokens(rng, 1))],
        [("c", _tokens(rng, 1)), ("d", d[5:9]), ("b", _tokens(rng, 1)), ("a", _tokens(rng, 1))],
    ]
    for i in range(5):
        rows = [("a", _tokens(rng, 1)), ("b", _tokens(rng, 1)), ("c", _tokens(rng, 1)), ("d", _tokens(rng, 1))]
        steps.append(rows[i % 4:] + rows[:i % 4])
    return steps


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    """name -> (model dir, spec): conv/attention/recurrent/attention, and a 5-layer mix with two of
    each fixed kind, kernel 3 and a tied LM head."""
    out = {}
    for name, spec in (
            ("crca", hybrid_spec()),
            ("mixed5", hybrid_spec(["recurrent", "conv", "attention", "conv", "recurrent"], conv_kernel=3,
                                   num_kv_heads=1, tie_word_embeddings=True))):
        path = tmp_path_factory.mktemp(name)
        build(None, str(path), random_spec=spec, block_size=BLOCK, max_batch_size=6, max_scheduled_tokens=128,
              seed=11)
        out[name] = (str(path), spec)
    return out


@pytest.mark.parametrize("name", ["crca", "mixed5"])
def test_hybrid_layers_match_the_numpy_reference_through_the_executor(hybrid_dirs, name):
    model_dir, spec = hybrid_dirs[name]
    loaded = random_model(spec, seed=11)
    runner = HybridSteps(model_dir)
    refs = {}
    worst = 0.0
    for rows in _schedule(np.random.default_rng(3)):
        got = runner.step(rows)
        expected = np.concatenate([refs.setdefault(n, Reference(loaded)).step(t)[-1:] for n, t in rows])
        assert got.shape == expected.shape and np.isfinite(got).all()
        worst = max(worst, float(np.abs(got - expected).max()))
    print(f"{name}: worst |logits - reference| {worst:.2e}")
    assert worst < TOL, worst
    # the committed states are the reference's final states
    tensors = runner.decoder.fixed_states
    for seq, ref in refs.items():
        states = ref.fixed_states()
        for t, state in zip(tensors, runner.states[seq]):
            np.testing.assert_allclose(state, states[t.layer], atol=1e-4, rtol=1e-4)


def test_the_fixed_state_carries_the_context(hybrid_dirs):
    """Feeding zeros instead of the committed state changes the logits (the state is not decorative)."""
    model_dir, spec = hybrid_dirs["crca"]
    loaded = random_model(spec, seed=11)
    rng = np.random.default_rng(5)
    prompt, nxt = _tokens(rng, 9), _tokens(rng, 1)
    runner = HybridSteps(model_dir)
    runner.step([("a", prompt)])
    good = runner.step([("a", nxt)])
    np.testing.assert_allclose(good[0], Reference(loaded).step(prompt + nxt)[-1], atol=TOL)
    runner2 = HybridSteps(model_dir)
    runner2.step([("a", prompt)])
    runner2.states["a"] = [np.zeros_like(s) for s in runner2.states["a"]]
    assert np.abs(runner2.step([("a", nxt)]) - good).max() > 1e-3


def test_bank_views_bind_in_place(hybrid_dirs):
    """Rows of two persistent [capacity, ...] banks bound directly (input bank interval, output bank
    interval): what the pool's direct path does, and the reference's states after each step."""
    model_dir, spec = hybrid_dirs["crca"]
    loaded = random_model(spec, seed=11)
    runner = HybridSteps(model_dir)
    tensors = runner.decoder.fixed_states
    capacity = 6
    banks = [[np.zeros((capacity,) + t.row_shape, t.dtype) for _ in range(2)] for t in tensors]
    rng = np.random.default_rng(9)
    seqs = {"a": _tokens(rng, 8), "b": _tokens(rng, 5)}
    refs = {n: Reference(loaded) for n in seqs}
    active = 0
    rows_of = [("a", None), ("b", None)]                 # slots 2 and 3
    for step in range(4):
        rows = [(n, seqs[n] if step == 0 else _tokens(rng, 1)) for n, _ in rows_of]
        arrays, columns = runner.pack(rows)
        pairs = [(bank[active][2:4].ctypes.data, bank[1 - active][2:4].ctypes.data) for bank in banks]
        status, message, _, count = runner.run(rows, arrays, columns, pairs)
        assert status == executors.STATUS_OK, message
        for name, tokens in rows:
            runner.length[name] = runner.length.get(name, 0) + len(tokens)
        expected = np.concatenate([refs[n].step(t)[-1:] for n, t in rows])
        np.testing.assert_allclose(runner.executor.logits[:count], expected, atol=TOL)
        active = 1 - active
        for r, (name, _) in enumerate(rows):
            for t, bank in zip(tensors, banks):
                np.testing.assert_allclose(bank[active][2 + r], refs[name].fixed_states()[t.layer], atol=1e-4,
                                           rtol=1e-4)
                assert not bank[active][[0, 1, 4, 5]].any()      # other slots untouched


def test_decoder_exposes_fixed_state_geometry(hybrid_dirs):
    model_dir, spec = hybrid_dirs["crca"]
    decoder = executors.load_decoder(decoder_names(model_dir))
    assert [(t.kind, t.layer, t.input_name, t.output_name) for t in decoder.fixed_states] == [
        ("fixed_conv", 0, "past_key_values.0.conv_state", "present.0.conv_state"),
        ("fixed_recurrent", 2, "past_key_values.2.recurrent_state", "present.2.recurrent_state")]
    conv, rec = decoder.fixed_states
    assert conv.dtype == np.float32 and conv.row_shape == (32, 3) and conv.row_bytes == 32 * 3 * 4
    assert rec.row_shape == (4, 8, 8) and rec.row_bytes == 4 * 8 * 8 * 4
    assert decoder.fixed_state_row_bytes == conv.row_bytes + rec.row_bytes
    # only the attention layers have paged caches: a block spans 2 layers
    assert decoder.bytes_per_block == 2 * 2 * BLOCK * 2 * 8 * 4
    executor = decoder.open_engine({"block_size": BLOCK, "num_blocks": 8, "max_batch_size": 2,
                                    "max_scheduled_tokens": 16, "max_block_table_columns": 8, "vocab_size": 97,
                                    "max_sequence_length": 0})
    assert executor.fixed_states == decoder.fixed_states
    assert sorted(executor.layer_caches) == [(1, "key"), (1, "value"), (3, "key"), (3, "value")]


def test_execute_refuses_missing_or_overlapping_fixed_state(hybrid_dirs):
    model_dir, _ = hybrid_dirs["crca"]
    runner = HybridSteps(model_dir)
    rows = [("a", [1, 2, 3])]
    arrays, columns = runner.pack(rows)
    status, message, _, _ = runner.run(rows, arrays, columns, None)
    assert status == executors.STATUS_FATAL and "2 fixed state tensors" in message
    status, message, _, _ = runner.run(rows, arrays, columns, [(1, 2)])
    assert status == executors.STATUS_FATAL and "passes 1" in message
    conv = np.zeros((1, 32, 3), np.float32)
    rec = [np.zeros((1, 4, 8, 8), np.float32) for _ in range(2)]
    status, message, _, _ = runner.run(rows, arrays, columns,
                                       [(conv.ctypes.data, conv.ctypes.data), (rec[0].ctypes.data, rec[1].ctypes.data)])
    assert status == executors.STATUS_FATAL and "overlaps" in message and "past_key_values.0.conv_state" in message
    status, message, _, _ = runner.run(rows, arrays, columns, [(0, rec[1].ctypes.data), (1, 2)])
    assert status == executors.STATUS_FATAL and "null address" in message


def test_models_without_fixed_state_are_unchanged(tmp_path):
    spec = tiny_spec(vocab_size=97, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8)
    assert not spec.hybrid() and spec.attention_layers() == [0, 1]
    build(None, str(tmp_path), random_spec=spec, block_size=BLOCK, seed=2)
    config = json.load(open(tmp_path / "genai_config.json"))
    assert config["model"]["decoder"]["state_groups"] == [{"kind": "paged_kv", "layer_ids": [0, 1]}]
    runner = HybridSteps(str(tmp_path))
    assert runner.decoder.fixed_states == () and runner.decoder.fixed_state_row_bytes == 0
    rows = [("a", [5, 6, 7])]
    arrays, columns = runner.pack(rows)
    a = {k: v.ctypes.data for k, v in arrays.items()}
    status, message, _, count = runner.executor.execute(StepInputs(  # no fixed state
        num_rows=1, num_tokens=3, input_ids=a["input_ids"], position_ids=a["position_ids"],
        cumulative_sequence_lengths=a["cu"], past_sequence_lengths=a["past"], block_table=a["block_table"],
        block_table_columns=columns, attention_metadata=a["metadata"], logits_indices=a["logits_indices"]))
    assert status == executors.STATUS_OK, message
    np.testing.assert_allclose(runner.executor.logits[:count][0],
                               Reference(random_model(spec, seed=2)).step([5, 6, 7])[-1], atol=TOL)
    status, message, _, _ = runner.run(rows, arrays, columns, [(1, 2)])
    assert status == executors.STATUS_FATAL and "no fixed state" in message


def test_build_writes_the_state_groups(hybrid_dirs):
    model_dir, spec = hybrid_dirs["mixed5"]
    config = json.load(open(os.path.join(model_dir, "genai_config.json")))
    decoder = config["model"]["decoder"]
    assert decoder["state_groups"] == [{"kind": "paged_kv", "layer_ids": [2]},
                                       {"kind": "fixed_conv", "layer_ids": [1, 3]},
                                       {"kind": "fixed_recurrent", "layer_ids": [0, 4]}]
    assert decoder["num_hidden_layers"] == 5
    # the graph uses OGA's default fixed-state templates, so the config does not repeat them
    for key in ("past_conv_names", "past_recurrent_names"):
        assert key not in decoder["inputs"]
    for key in ("present_conv_names", "present_recurrent_names"):
        assert key not in decoder["outputs"]
    model = onnx.load(os.path.join(model_dir, "model.onnx"), load_external_data=False)

    def dims(values):
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}
    inputs, outputs = dims(model.graph.input), dims(model.graph.output)
    assert [n for n in inputs if n.endswith((".key", ".value"))] == ["past_key_values.2.key",
                                                                     "past_key_values.2.value"]
    assert inputs["past_key_values.1.conv_state"] == ["batch_size", 32, 2]
    assert outputs["present.3.conv_state"] == ["batch_size", 32, 2]
    assert inputs["past_key_values.0.recurrent_state"] == ["batch_size", 4, 8, 8]
    assert outputs["present.4.recurrent_state"] == ["batch_size", 4, 8, 8]
    # a model with only one fixed kind omits the other group
    only_conv = hybrid_spec(["attention", "conv"])
    from oga.models.genai_config import state_groups
    assert state_groups(only_conv) == [{"kind": "paged_kv", "layer_ids": [0]},
                                       {"kind": "fixed_conv", "layer_ids": [1]}]


def test_spec_refuses_bad_layer_types(tmp_path):
    with pytest.raises(ValueError, match="at least one 'attention'"):
        hybrid_spec(["conv", "recurrent"]).check()
    with pytest.raises(ValueError, match="unknown kinds"):
        hybrid_spec(["attention", "mamba"]).check()
    with pytest.raises(ValueError, match="names 2 layers"):
        hybrid_spec(["attention", "conv"], num_layers=3).check()
    with pytest.raises(ValueError, match="conv_kernel"):
        hybrid_spec(conv_kernel=1).check()
    with pytest.raises(ValueError, match="not attention layers"):
        hybrid_spec(sliding_window=8, sliding_window_layers=[0]).check()
    with pytest.raises(ValueError, match="every attention layer"):
        hybrid_spec(sliding_window=8, sliding_window_layers=[1, 3]).check()
    hybrid_spec(sliding_window=8, sliding_window_layers=[1]).check()
    with pytest.raises(NotImplementedError, match="cpu target only"):
        build(None, str(tmp_path), random_spec=hybrid_spec(), target="cuda")


def test_reference_forward_with_states_matches_stepping():
    spec = hybrid_spec()
    loaded = random_model(spec, seed=4)
    tokens = _tokens(np.random.default_rng(1), 12)
    logits, states = forward_with_states(loaded, tokens)
    ref = Reference(loaded)
    stepped = np.concatenate([ref.step(tokens[:5]), ref.step(tokens[5:6]), ref.step(tokens[6:])])
    np.testing.assert_allclose(stepped, logits, atol=1e-10)
    assert sorted(states) == [0, 2] and states[0].shape == (32, 3) and states[2].shape == (4, 8, 8)
    for layer, state in ref.fixed_states().items():
        np.testing.assert_allclose(state, states[layer], atol=1e-10)
    # the conv state is the last K-1 conv inputs
    assert np.abs(states[0]).max() > 0


def test_cli_builds_a_hybrid_model(tmp_path, capsys):
    from oga.models.__main__ import main as cli_main
    out = tmp_path / "cli"
    assert cli_main(["build", "--random", "--layers", "3", "--hidden", "32", "--heads", "4", "--vocab", "97",
                     "--layer-types", "conv,attention,recurrent", "--conv-kernel", "3", "-o", str(out)]) == 0
    groups = json.load(open(out / "genai_config.json"))["model"]["decoder"]["state_groups"]
    assert groups == [{"kind": "paged_kv", "layer_ids": [1]}, {"kind": "fixed_conv", "layer_ids": [0]},
                      {"kind": "fixed_recurrent", "layer_ids": [2]}]
    decoder = executors.load_decoder(decoder_names(str(out)))
    assert [t.row_shape for t in decoder.fixed_states] == [(32, 2), (4, 8, 8)]
    assert cli_main(["build", "--random", "--layers", "2", "--layer-types", "conv,recurrent", "-o", str(tmp_path / "x")]) == 2
    assert "attention" in capsys.readouterr().err


def _edit(model_dir, tmp_path, edit):
    bad = tmp_path / "bad"
    bad.mkdir(parents=True)
    model = onnx.load(os.path.join(model_dir, "model.onnx"))
    edit(model)
    onnx.save(model, str(bad / "model.onnx"))
    with open(os.path.join(model_dir, "genai_config.json")) as f:
        (bad / "genai_config.json").write_text(f.read())
    return str(bad)


def _value(values, name):
    return next(v for v in values if v.name == name)


def test_load_errors_name_the_fixed_state_tensor(hybrid_dirs, tmp_path):
    model_dir, _ = hybrid_dirs["crca"]

    def drop_output(model):
        model.graph.output.remove(_value(model.graph.output, "present.2.recurrent_state"))
    with pytest.raises(executors.ModelLoadError, match="no output 'present.2.recurrent_state'"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "a", drop_output)))

    def fixed_batch(model):
        _value(model.graph.input, "past_key_values.0.conv_state").type.tensor_type.shape.dim[0].dim_value = 4
    with pytest.raises(executors.ModelLoadError, match="'past_key_values.0.conv_state'.*dynamic batch axis"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "b", fixed_batch)))

    def other_geometry(model):
        _value(model.graph.input, "past_key_values.0.conv_state").type.tensor_type.shape.dim[2].dim_value = 5
    with pytest.raises(executors.ModelLoadError,
                       match=r"'present.0.conv_state'.*per-row geometry of 'past_key_values.0.conv_state'"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "c", other_geometry)))

    def dynamic_dim(model):
        _value(model.graph.input, "past_key_values.2.recurrent_state").type.tensor_type.shape.dim[1].dim_param = "h"
    with pytest.raises(executors.ModelLoadError, match="'past_key_values.2.recurrent_state'.*statically known"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "d", dynamic_dim)))

    # a template without %d: the core refuses the configuration before any executor sees it
    config = og.Config(model_dir)
    with pytest.raises(RuntimeError, match="binding 'state' has malformed input template 'conv_state'; expected "
                                           "exactly one %d"):
        config.overlay(json.dumps({"model": {"decoder": {"inputs": {"past_conv_names": "conv_state"}}}}))
    # a renamed template that the graph lacks
    config.overlay(json.dumps({"model": {"decoder": {"inputs": {"past_conv_names": "conv.%d.state"}}}}))
    names = testing.decoder_names(config)
    assert [(kind, layer, i) for kind, layer, i, _ in names["fixed_states"]][0] == ("fixed_conv", 0, "conv.0.state")
    with pytest.raises(executors.ModelLoadError, match="no input 'conv.0.state'"):
        executors.load_decoder(names)


# --------------------------------------------------------------------------------------------
# Per-token fixed-state capture (draft verification, "compact replay")

@pytest.fixture(scope="module")
def capture_dirs(tmp_path_factory):
    """The hybrid_dirs specs built with per_token_logits, which turns state_capture on."""
    out = {}
    for name, spec in (
            ("crca", hybrid_spec()),
            ("mixed5", hybrid_spec(["recurrent", "conv", "attention", "conv", "recurrent"], conv_kernel=3,
                                   num_kv_heads=1, tie_word_embeddings=True))):
        path = tmp_path_factory.mktemp(name + "_capture")
        build(None, str(path), random_spec=spec, block_size=BLOCK, max_batch_size=6, max_scheduled_tokens=128,
              per_token_logits=True, seed=11)
        out[name] = (str(path), spec)
    return out


@pytest.mark.parametrize("name", ["crca", "mixed5"])
def test_captured_per_token_states_match_the_reference(capture_dirs, name):
    """Multi-token rows, new and continuing (nonzero initial state), in changing order: every captured
    token's state is the reference's state after that token, and a row's last one is its present."""
    model_dir, spec = capture_dirs[name]
    loaded = random_model(spec, seed=11)
    runner = HybridSteps(model_dir)
    assert runner.decoder.per_token_logits and runner.decoder.fixed_state_capture
    tensors = runner.decoder.fixed_states
    rng = np.random.default_rng(7)
    steps = [
        [("a", _tokens(rng, 6)), ("b", _tokens(rng, 1)), ("c", _tokens(rng, 4))],
        [("c", _tokens(rng, 5)), ("a", _tokens(rng, 3)), ("d", _tokens(rng, 2)), ("b", _tokens(rng, 1))],
        [("b", _tokens(rng, 7)), ("a", _tokens(rng, 1)), ("d", _tokens(rng, 4)), ("c", _tokens(rng, 2))],
    ]
    refs = {}
    worst = 0.0
    for number, rows in enumerate(steps):
        if number:                           # continuing rows start from a nonzero committed state
            assert all(np.abs(s).max() > 0 for seq, _ in rows if seq in runner.states for s in runner.states[seq])
        got = runner.step(rows)
        assert got.shape[0] == sum(len(t) for _, t in rows)
        start = 0
        for r, (seq, tokens) in enumerate(rows):
            ref = refs.setdefault(seq, Reference(loaded))
            np.testing.assert_allclose(got[start:start + len(tokens)], ref.step(tokens), atol=TOL)
            per_token = ref.token_states()
            for t, captured, present in zip(tensors, runner.captured, runner.presents):
                mine = captured[start:start + len(tokens)]
                assert mine.shape == (len(tokens),) + t.row_shape
                worst = max(worst, float(np.abs(mine - per_token[t.layer]).max()))
                np.testing.assert_allclose(mine, per_token[t.layer], atol=1e-4, rtol=1e-4)
                if t.kind == "fixed_conv":   # the same gathered inputs
                    np.testing.assert_array_equal(mine[-1], present[r])
                else:
                    np.testing.assert_allclose(mine[-1], present[r], atol=1e-5, rtol=1e-5)
            start += len(tokens)
    print(f"{name}: worst |captured state - reference| {worst:.2e}")


def test_a_captured_state_replays_an_accepted_draft_prefix(capture_dirs):
    """Verify 4 drafts in one row, accept 2: committing the capture of the 2nd drafted token (not
    present) continues the sequence exactly as if only the accepted prefix had been fed."""
    model_dir, spec = capture_dirs["crca"]
    loaded = random_model(spec, seed=11)
    rng = np.random.default_rng(13)
    prompt, drafts, nxt, other = _tokens(rng, 6), _tokens(rng, 4), _tokens(rng, 1), _tokens(rng, 5)
    runner = HybridSteps(model_dir)
    runner.step([("a", prompt), ("b", other)])
    runner.step([("b", _tokens(rng, 1)), ("a", drafts)])
    accepted = 2
    start = 1                                # a's tokens follow b's one token
    runner.states["a"] = [c[start + accepted - 1].copy() for c in runner.captured]
    runner.length["a"] = len(prompt) + accepted   # the rejected drafts' positions are written over
    got = runner.step([("a", nxt)])
    np.testing.assert_allclose(got[-1], Reference(loaded).step(prompt + drafts[:accepted] + nxt)[-1], atol=TOL)


def test_capture_decoder_exposes_the_capture_outputs(capture_dirs, hybrid_dirs):
    model_dir, _ = capture_dirs["crca"]
    decoder = executors.load_decoder(decoder_names(model_dir))
    assert decoder.fixed_state_capture
    assert [t.capture_name for t in decoder.fixed_states] == ["present.0.conv_state.per_token",
                                                              "present.2.recurrent_state.per_token"]
    model = onnx.load(os.path.join(model_dir, "model.onnx"), load_external_data=False)
    outputs = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.output}
    assert outputs["present.0.conv_state.per_token"] == ["num_tokens", 32, 3]
    assert outputs["present.2.recurrent_state.per_token"] == ["num_tokens", 4, 8, 8]
    assert outputs["present.0.conv_state"] == ["batch_size", 32, 3]     # present.* unchanged
    # without per_token_logits (the default) there is nothing to capture
    plain = executors.load_decoder(decoder_names(hybrid_dirs["crca"][0]))
    assert not plain.fixed_state_capture and all(t.capture_name is None for t in plain.fixed_states)


def test_execute_checks_the_capture_addresses(capture_dirs, hybrid_dirs):
    runner = HybridSteps(capture_dirs["crca"][0])
    rows = [("a", [1, 2, 3])]
    arrays, columns = runner.pack(rows)
    conv = [np.zeros((1, 32, 3), np.float32) for _ in range(2)]
    rec = [np.zeros((1, 4, 8, 8), np.float32) for _ in range(2)]
    caps = [np.zeros((3, 32, 3), np.float32), np.zeros((3, 4, 8, 8), np.float32)]

    def entries(conv_capture, rec_capture):
        return [(conv[0].ctypes.data, conv[1].ctypes.data, conv_capture),
                (rec[0].ctypes.data, rec[1].ctypes.data, rec_capture)]
    pairs = [e[:2] for e in entries(0, 0)]
    status, message, _, _ = runner.run(rows, arrays, columns, pairs)
    assert status == executors.STATUS_FATAL
    assert "no capture address" in message and "present.0.conv_state.per_token" in message
    status, message, _, _ = runner.run(rows, arrays, columns, entries(caps[0].ctypes.data, 0))
    assert status == executors.STATUS_FATAL
    assert "no capture address" in message and "'past_key_values.2.recurrent_state'" in message
    status, message, _, _ = runner.run(rows, arrays, columns, entries(caps[0].ctypes.data, rec[0].ctypes.data))
    assert status == executors.STATUS_FATAL and "overlaps 'past_key_values.2.recurrent_state'" in message
    status, message, _, _ = runner.run(rows, arrays, columns, entries(conv[1].ctypes.data, caps[1].ctypes.data))
    assert status == executors.STATUS_FATAL and "overlaps 'present.0.conv_state'" in message
    status, message, _, _ = runner.run(rows, arrays, columns, [(1, 2, 3, 4), (1, 2, 3)])
    assert status == executors.STATUS_FATAL and "triple" in message
    status, message, _, _ = runner.run(rows, arrays, columns, pairs[:1])
    assert status == executors.STATUS_FATAL and "passes 1 (input, output, capture) address triples" in message
    status, message, _, count = runner.run(rows, arrays, columns, entries(caps[0].ctypes.data, caps[1].ctypes.data))
    assert status == executors.STATUS_OK and count == 3, message
    np.testing.assert_array_equal(caps[0][-1], conv[1][0])
    # a decoder without capture outputs takes pairs, or triples whose capture is 0, never a capture
    plain = HybridSteps(hybrid_dirs["crca"][0])
    arrays, columns = plain.pack(rows)
    status, message, _, _ = plain.run(rows, arrays, columns, entries(caps[0].ctypes.data, caps[1].ctypes.data))
    assert status == executors.STATUS_FATAL and "no per-token state output" in message
    status, message, _, _ = plain.run(rows, arrays, columns, entries(0, 0))
    assert status == executors.STATUS_OK, message


def test_capture_load_errors_name_the_tensor(capture_dirs, tmp_path):
    model_dir, _ = capture_dirs["crca"]

    def drop_capture(model):
        model.graph.output.remove(_value(model.graph.output, "present.2.recurrent_state.per_token"))
    with pytest.raises(executors.ModelLoadError,
                       match=r"present.0.conv_state.per_token.*no output 'present.2.recurrent_state.per_token'"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "a", drop_capture)))

    def static_tokens(model):
        _value(model.graph.output, "present.0.conv_state.per_token").type.tensor_type.shape.dim[0].dim_value = 3
    with pytest.raises(executors.ModelLoadError, match="'present.0.conv_state.per_token'.*dynamic axis 0"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "b", static_tokens)))

    def cut(output, axis, end):
        """The graph's capture `output` cut to `end` entries along `axis` (ONNX Runtime reports the
        shape it infers, so a wrong geometry has to come from the graph itself)."""
        def edit(model):
            node = next(n for n in model.graph.node if output in n.output)
            node.output[list(node.output).index(output)] = output + "/uncut"
            model.graph.node.append(onnx.helper.make_node(
                "Slice", [output + "/uncut", "cut/starts", "cut/ends", "cut/axes"], [output]))
            for name, value in (("starts", 0), ("ends", end), ("axes", axis)):
                model.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray([value], np.int64),
                                                                            "cut/" + name))
            _value(model.graph.output, output).type.tensor_type.shape.dim[axis].dim_value = end
        return edit
    with pytest.raises(executors.ModelLoadError, match=r"'present.2.recurrent_state.per_token' has shape "
                                                           r"\['num_tokens', 2, 8, 8\]; expected \[num_tokens, 4, 8, 8\]"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "c",
                                                       cut("present.2.recurrent_state.per_token", 1, 2))))
    with pytest.raises(executors.ModelLoadError, match=r"'present.0.conv_state.per_token'.*\[num_tokens, 32, 3\]"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "d",
                                                       cut("present.0.conv_state.per_token", 2, 1))))

    def cast(model):
        output = "present.0.conv_state.per_token"
        node = next(n for n in model.graph.node if output in n.output)
        node.output[list(node.output).index(output)] = output + "/float"
        model.graph.node.append(onnx.helper.make_node("Cast", [output + "/float"], [output],
                                                      to=onnx.TensorProto.DOUBLE))
        _value(model.graph.output, output).type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    with pytest.raises(executors.ModelLoadError,
                       match=r"'present.0.conv_state.per_token' has type tensor\(double\); expected the type"):
        executors.load_decoder(decoder_names(_edit(model_dir, tmp_path / "e", cast)))


def test_state_capture_builder_options(tmp_path, capsys):
    from oga.models.onnx_cpu import build_cpu_graph
    spec = hybrid_spec()
    weights = random_model(spec, seed=1).weights

    def captures(model):
        return [o.name for o in model.graph.output if o.name.endswith(".per_token")]
    assert captures(build_cpu_graph(spec, weights, block_size=BLOCK)) == []
    assert captures(build_cpu_graph(spec, weights, block_size=BLOCK, per_token_logits=True)) == [
        "present.0.conv_state.per_token", "present.2.recurrent_state.per_token"]
    assert captures(build_cpu_graph(spec, weights, block_size=BLOCK, per_token_logits=True, state_capture=False)) == []
    with pytest.raises(ValueError, match="state_capture.*needs per_token_logits"):
        build_cpu_graph(spec, weights, block_size=BLOCK, state_capture=True)
    with pytest.raises(ValueError, match="state_capture.*needs per_token_logits"):
        build(None, str(tmp_path / "x"), random_spec=spec, state_capture=True)
    plain = tiny_spec(vocab_size=97, hidden_size=32, intermediate_size=48, num_heads=4, num_kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="hybrid"):
        build_cpu_graph(plain, random_model(plain, seed=1).weights, per_token_logits=True, state_capture=True)
    assert captures(build_cpu_graph(plain, random_model(plain, seed=1).weights, per_token_logits=True)) == []
    from oga.models.__main__ import main as cli_main
    base = ["build", "--random", "--layers", "3", "--hidden", "32", "--heads", "4", "--vocab", "97",
            "--layer-types", "conv,attention,recurrent", "--per-token-logits"]
    assert cli_main(base + ["--no-state-capture", "-o", str(tmp_path / "off")]) == 0
    assert not executors.load_decoder(decoder_names(str(tmp_path / "off"))).fixed_state_capture
    assert cli_main(base[:-1] + ["--state-capture", "-o", str(tmp_path / "bad")]) == 2
    assert "per_token_logits" in capsys.readouterr().err


def test_reference_per_token_states():
    spec = hybrid_spec()
    loaded = random_model(spec, seed=4)
    tokens = _tokens(np.random.default_rng(2), 7)
    logits, states, per_token = forward_with_states(loaded, tokens, per_token_states=True)
    assert sorted(per_token) == [0, 2] and per_token[0].shape == (7, 32, 3) and per_token[2].shape == (7, 4, 8, 8)
    ref = Reference(loaded)
    for t, token in enumerate(tokens):       # token by token: the committed state after each
        ref.step([token])
        for layer, state in ref.fixed_states().items():
            np.testing.assert_allclose(per_token[layer][t], state, atol=1e-12)
            np.testing.assert_allclose(ref.token_states()[layer][0], state, atol=1e-12)
    for layer, state in states.items():
        np.testing.assert_array_equal(per_token[layer][-1], state)
    ref.step([])
    assert all(v.shape[0] == 0 for v in ref.token_states().values())
