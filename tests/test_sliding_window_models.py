"""Sliding-window ring layers (seed "Sliding-window paged layers") on the Python side: the CPU graph builder, the numpy
reference and the ONNX executor, driven directly with hand-made packed steps (no C++ engine).

A ring layer attends to the last W positions only (q - W < k <= q) and keeps its K/V in a ring of
R blocks per request, R = ceil((C + W - 1) / block_size), addressed through block_table_windowed
(entry j of a row = its ring block j mod R); the full layers keep the whole sequence in the
paged cache through block_table.
"""
import json
import math
import os

import numpy as np
import onnx
import pytest

from model_dirs import decoder_names
from oga import executor as executors
from oga._core import StepInputs
from oga.models import build
from oga.models.__main__ import main as cli_main
from oga.models.onnx_cuda import build_cuda_graph
from oga.models.random_weights import random_model, tiny_spec
from oga.models.reference import Reference

BLOCK = 4
TOL = 1e-4


def ring_spec(num_layers=3, ring=(0, 2), window=10, **overrides):
    fields = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=num_layers, num_heads=4,
                  num_kv_heads=2, head_dim=16, context_length=512, sliding_window=window,
                  sliding_window_layers=list(ring))
    fields.update(overrides)
    return tiny_spec(**fields)


class RingSteps:
    """Plays the engine: packs rows into the buffers OgaExtStepInputs describes and calls
    OnnxEngineExecutor.execute with their addresses. Full blocks come scattered from one pool
    (each row's table also holds `reserve_ahead` unused blocks, and -1 past them); every request
    takes R scattered ring blocks from the window pool at its first step, and its windowed table
    repeats them over all columns (or, with `ring_padding`, is -1 past the row's own blocks).
    Every cache is NaN-filled in place first, so a read of a slot nothing wrote poisons logits."""

    def __init__(self, model_dir, chunk_size, window, max_batch_size=6, num_blocks=96, seed=0,
                 reserve_ahead=1, ring_padding=False, nan_fill=True):
        self.decoder = executors.load_decoder(decoder_names(model_dir))
        self.block_size = self.decoder.names["block_size"]
        self.chunk_size, self.reserve_ahead, self.ring_padding = chunk_size, reserve_ahead, ring_padding
        self.ring_blocks = math.ceil((chunk_size + window - 1) / self.block_size)
        self.geometry = {
            "block_size": self.block_size, "num_blocks": num_blocks, "max_batch_size": max_batch_size,
            "max_scheduled_tokens": 64, "max_block_table_columns": num_blocks,
            "vocab_size": self.decoder.names["vocab_size"], "max_sequence_length": 0,
            "window_ring_blocks": self.ring_blocks, "window_blocks": self.ring_blocks * max_batch_size}
        self.executor = self.decoder.open_engine(self.geometry)
        if nan_fill:
            for cache in self.executor.caches:
                cache.fill(np.nan)
        rng = np.random.default_rng(seed)
        self.free = [int(b) for b in rng.permutation(num_blocks)]
        self.free_ring = [int(b) for b in rng.permutation(self.geometry["window_blocks"])]
        self.blocks, self.rings, self.length = {}, {}, {}

    def step(self, rows):
        """rows: [(sequence, new tokens)]; returns the executor's logits rows (a copy)."""
        ids, positions, cu, past, tables, rings = [], [], [0], [], [], []
        for name, tokens in rows:
            assert 0 < len(tokens) <= self.chunk_size, "the engine caps a row's query at chunk_size"
            start = self.length.get(name, 0)
            table = self.blocks.setdefault(name, [])
            while len(table) * self.block_size < start + len(tokens) + self.reserve_ahead * self.block_size:
                table.append(self.free.pop())
            if name not in self.rings:
                self.rings[name] = [self.free_ring.pop() for _ in range(self.ring_blocks)]
            ids += list(tokens)
            positions += list(range(start, start + len(tokens)))
            cu.append(cu[-1] + len(tokens))
            past.append(start)
            tables.append(table)
            rings.append(self.rings[name])
            self.length[name] = start + len(tokens)
        columns = max(len(t) for t in tables)
        block_table = np.full((len(rows), columns), -1, np.int32)
        windowed = np.full((len(rows), columns), -1, np.int32)
        for r, (table, ring) in enumerate(zip(tables, rings)):
            block_table[r, :len(table)] = table
            own = len(table) if self.ring_padding else columns
            windowed[r, :own] = [ring[j % self.ring_blocks] for j in range(own)]
        q = np.diff(cu)
        arrays = dict(
            input_ids=np.asarray(ids, np.int64), position_ids=np.asarray(positions, np.int64),
            cu=np.asarray(cu, np.int32), past=np.asarray(past, np.int32), block_table=block_table,
            metadata=np.asarray([q.max(), max(p + n for p, n in zip(past, q)), max(p + n for p, n in zip(past, q))],
                                np.int32),
            logits_indices=np.asarray(np.asarray(cu[1:]) - 1, np.int32), windowed=windowed)
        a = {k: v.ctypes.data for k, v in arrays.items()}
        status, message, address, count = self.executor.execute(StepInputs(
            num_rows=len(rows), num_tokens=len(ids), input_ids=a["input_ids"], position_ids=a["position_ids"],
            cumulative_sequence_lengths=a["cu"], past_sequence_lengths=a["past"], block_table=a["block_table"],
            block_table_columns=columns, attention_metadata=a["metadata"], logits_indices=a["logits_indices"],
            block_table_windowed=a["windowed"]))
        assert status == executors.STATUS_OK, message
        assert address == self.executor.logits.ctypes.data
        return self.executor.logits[:count].copy()

    def ring_slot(self, name, position):
        """(ring block, slot) that holds `position` of `name` in a ring layer."""
        return self.rings[name][(position // self.block_size) % self.ring_blocks], position % self.block_size

    def full_slot(self, name, position):
        return self.blocks[name][position // self.block_size], position % self.block_size


def _tokens(rng, n, vocab=97):
    return [int(t) for t in rng.integers(0, vocab, n)]


def _schedule(rng, chunk):
    """Steps of (sequence, new tokens): "long" (a 70-token prompt in chunks of `chunk`, then 24
    decodes: the ring wraps several times) runs alongside short prompts, chunked prompts that
    start mid-way and decodes, so steps are pure prefill, mixed, and pure decode."""
    long_prompt = _tokens(rng, 70)
    chunks = [long_prompt[i:i + chunk] for i in range(0, len(long_prompt), chunk)]
    other = {"b": _tokens(rng, 3), "c": _tokens(rng, chunk), "d": _tokens(rng, 2 * chunk + 1)}
    steps = []
    for i, piece in enumerate(chunks):
        rows = [("long", piece)]
        if i == 1:
            rows.append(("b", other["b"]))
        elif i > 1 and i < 6:
            rows.append(("b", _tokens(rng, 1)))
        if i == 3:
            rows.insert(0, ("c", other["c"]))
        elif i > 3:
            rows.insert(0, ("c", _tokens(rng, 1)))
        if 5 <= i < 8:
            d = other["d"][(i - 5) * chunk:(i - 4) * chunk]
            if d:
                rows.append(("d", d))
        steps.append(rows)
    for i in range(24):
        rows = [("long", _tokens(rng, 1))]
        if i % 3 == 0:
            rows.append(("c", _tokens(rng, 1)))
        if i == 5:
            rows.append(("e", _tokens(rng, chunk)))
        steps.append(rows)
    return steps


def _check_schedule(runner, loaded, steps, per_token):
    refs = {}
    worst = 0.0
    for rows in steps:
        got = runner.step(rows)
        expected = []
        for name, tokens in rows:
            logits = refs.setdefault(name, Reference(loaded)).step(tokens)
            expected.append(logits if per_token else logits[-1:])
        expected = np.concatenate(expected)
        assert got.shape == expected.shape
        assert np.isfinite(got).all()
        worst = max(worst, float(np.abs(got - expected).max()))
    return worst, refs


GRAPHS = ("standard", "fused")      # the CPU builder's graphs: standard ONNX ops, oga's fused operators


@pytest.fixture(scope="module")
def ring_dirs(tmp_path_factory):
    """(name, graph) -> (model dir, spec, chunk size): ring layers 0 and 2 of 3 (W 10, C 6 -> R 4, a
    16-slot ring), ring layer 1 of 2 with per-token logits (W 8, C 4 -> R 3), and a 4-layer model
    (W 12, C 8); each as both CPU graphs."""
    out = {}
    for name, spec, chunk, per_token in (
            ("ring02", ring_spec(3, (0, 2), 10), 6, False),
            ("ring1-per-token", ring_spec(2, (1,), 8), 4, True),
            ("ring4", ring_spec(4, (1, 2, 3), 12, num_kv_heads=1, tie_word_embeddings=True), 8, False)):
        for graph in GRAPHS:
            path = tmp_path_factory.mktemp(f"{name}-{graph}")
            build(None, str(path), random_spec=spec, block_size=BLOCK, chunk_size=chunk, max_batch_size=4,
                  max_scheduled_tokens=64, per_token_logits=per_token, seed=5, graph=graph)
            out[name, graph] = (str(path), spec, chunk)
    return out


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("name, ring_padding", [("ring02", False), ("ring1-per-token", False), ("ring4", False),
                                                ("ring02", True)])
def test_ring_layers_match_the_numpy_reference_through_the_executor(ring_dirs, name, ring_padding, graph):
    model_dir, spec, chunk = ring_dirs[name, graph]
    loaded = random_model(spec, seed=5)
    runner = RingSteps(model_dir, chunk, spec.sliding_window, ring_padding=ring_padding)
    assert runner.decoder.windowed_block_table and runner.decoder.ring_layers == set(spec.sliding_window_layers)
    steps = _schedule(np.random.default_rng(11), chunk)
    worst, refs = _check_schedule(runner, loaded, steps, per_token=name.endswith("per-token"))
    print(f"{name}: max abs diff {worst:.2e} over {len(steps)} steps")
    assert worst < TOL
    # the long sequence wrapped its ring several times
    assert runner.length["long"] > 4 * runner.ring_blocks * BLOCK

    # Storage: a ring layer holds the last W positions of "long" at ring slot p mod (R * B); a full
    # layer holds every position at its block-table slot.
    length = runner.length["long"]
    ref = refs["long"]
    caches = runner.executor.layer_caches
    for layer in range(spec.num_layers):
        for kind, stored in (("key", ref.keys[layer]), ("value", ref.values[layer])):
            cache = caches[(layer, kind)]
            if layer in spec.sliding_window_layers:
                assert cache.shape == (runner.geometry["window_blocks"], BLOCK, spec.num_kv_heads, spec.head_dim)
                wanted = range(length - spec.sliding_window, length)
                slot = runner.ring_slot
            else:
                assert cache.shape == (runner.geometry["num_blocks"], BLOCK, spec.num_kv_heads, spec.head_dim)
                wanted = range(length)
                slot = runner.full_slot
            for p in wanted:
                assert np.abs(cache[slot("long", p)] - stored[p]).max() < TOL, (layer, kind, p)


def test_a_full_layer_model_and_a_whole_model_window_are_unchanged(tmp_path):
    """Without sliding_window_layers a window applies to every layer over the full cache (Mistral):
    no block_table_windowed, no sliding_window in genai_config, executor not windowed."""
    spec = tiny_spec(vocab_size=97, architecture="mistral", sliding_window=5)
    out = build(None, str(tmp_path / "mistral"), random_spec=spec, block_size=BLOCK, max_batch_size=2)
    config = json.load(open(os.path.join(out, "genai_config.json")))
    assert "sliding_window" not in config["model"]["decoder"]
    assert "block_table_windowed" not in config["model"]["decoder"]["inputs"]
    assert "chunk_size" not in config["search"]
    decoder = executors.load_decoder(decoder_names(out))
    assert not decoder.windowed_block_table and not decoder.ring_layers
    executor = decoder.open_engine({"block_size": BLOCK, "num_blocks": 8, "max_batch_size": 2,
                                    "max_scheduled_tokens": 16, "max_block_table_columns": 8, "vocab_size": 97,
                                    "max_sequence_length": 0, "window_ring_blocks": 0, "window_blocks": 0})
    assert all(cache.shape[0] == 8 for cache in executor.caches)
    # which layers the reference windows
    assert all(spec.windowed(i) for i in range(spec.num_layers)) and spec.ring_layers() == []
    assert not tiny_spec().windowed(0)
    assert ring_spec(3, (0, 2)).windowed(2) and not ring_spec(3, (0, 2)).windowed(1)


def test_a_ring_layer_is_windowed_and_a_full_layer_is_not():
    """The reference itself: a ring layer ignores everything before the window; a full one does not."""
    spec = ring_spec(2, (0,), 4, num_kv_heads=4)
    loaded = random_model(spec, seed=1)
    rng = np.random.default_rng(0)
    prefix, tail = _tokens(rng, 9), _tokens(rng, 6)
    base = Reference(loaded).step(prefix + tail)[-1]
    # Changing tokens outside every window of the last 3 tokens changes the logits only through the
    # full layer 1 -- so with layer 1 made windowed too, it changes nothing.
    from dataclasses import replace
    changed = list(prefix)
    changed[0] = (changed[0] + 1) % 97
    assert np.abs(Reference(loaded).step(changed + tail)[-1] - base).max() > 1e-6
    both = replace(loaded, spec=replace(spec, sliding_window_layers=None))
    a, b = Reference(both).step(prefix + tail)[-1], Reference(both).step(changed + tail)[-1]
    # with W = 4 and 2 layers, position 0 reaches the last token only through 2*(W-1) = 6 < 14 steps
    assert np.abs(a - b).max() < 1e-12


def test_the_executor_needs_window_blocks_and_a_windowed_table(ring_dirs):
    model_dir, spec, chunk = ring_dirs["ring02", "fused"]
    decoder = executors.load_decoder(decoder_names(model_dir))
    assert decoder.windowed_block_table and decoder.ring_layers == {0, 2}
    layer_bytes = BLOCK * spec.num_kv_heads * spec.head_dim * 4 * 2
    # A full-pool block spans the full layers only (seed "Decoder state manifest").
    assert decoder.bytes_per_block == layer_bytes * 1
    assert decoder.bytes_per_window_block == layer_bytes * 2
    geometry = {"block_size": BLOCK, "num_blocks": 16, "max_batch_size": 2, "max_scheduled_tokens": 16,
                "max_block_table_columns": 16, "vocab_size": 97, "max_sequence_length": 0,
                "window_ring_blocks": 0, "window_blocks": 0}
    with pytest.raises(RuntimeError, match=r"keeps its sliding-window layers \[0, 2\] in a ring of blocks "
                                           r"\('block_table_windowed'\), but the engine allocated no window blocks"):
        decoder.open_engine(geometry)
    runner = RingSteps(model_dir, chunk, spec.sliding_window, nan_fill=False)
    assert all(not cache.any() for cache in runner.executor.caches)   # allocated zeroed
    addresses = [cache.ctypes.data for cache in runner.executor.caches]
    runner.step([("a", [5, 6, 7])])
    assert [cache.ctypes.data for cache in runner.executor.caches] == addresses
    # written in place: the ring caches hold the step's keys
    assert all(runner.executor.layer_caches[(layer, "key")].any() for layer in (0, 1, 2))
    ids = np.asarray([1], np.int64)
    small = np.zeros(4, np.int32)
    table = np.zeros((1, 1), np.int32)
    status, message, _, _ = runner.executor.execute(StepInputs(  # no windowed table
        num_rows=1, num_tokens=1, input_ids=ids.ctypes.data, position_ids=ids.ctypes.data,
        cumulative_sequence_lengths=small.ctypes.data, past_sequence_lengths=small.ctypes.data,
        block_table=table.ctypes.data, block_table_columns=1, attention_metadata=small.ctypes.data,
        logits_indices=small.ctypes.data))
    assert status == executors.STATUS_FATAL and "block_table_windowed" in message


def _edited_copy(model_dir, dest, edit_model=None, edit_config=None):
    import shutil
    shutil.copytree(model_dir, dest)
    if edit_model:
        model = onnx.load(os.path.join(dest, "model.onnx"))
        edit_model(model)
        onnx.save(model, os.path.join(dest, "model.onnx"))
    if edit_config:
        config = json.load(open(os.path.join(dest, "genai_config.json")))
        edit_config(config)
        json.dump(config, open(os.path.join(dest, "genai_config.json"), "w"))
    return str(dest)


def test_load_errors_name_the_windowed_table_and_the_ring_layers(ring_dirs, tmp_path):
    model_dir, _, _ = ring_dirs["ring02", "standard"]     # the executor's checks, not ONNX Runtime's

    def int64_table(model):
        next(i for i in model.graph.input if i.name == "block_table_windowed").type.tensor_type.elem_type = \
            onnx.TensorProto.INT64

    bad = _edited_copy(model_dir, tmp_path / "dtype", edit_model=int64_table)
    with pytest.raises(executors.ModelLoadError,
                       match=r"model\.onnx: tensor 'block_table_windowed' has type tensor\(int64\); "
                             r"expected tensor\(int32\)"):
        executors.load_decoder(decoder_names(bad))

    def no_window(config):
        del config["model"]["decoder"]["sliding_window"]

    bad = _edited_copy(model_dir, tmp_path / "nowindow", edit_config=no_window)
    with pytest.raises(executors.ModelLoadError,
                       match=r"the graph takes 'block_table_windowed' .*"
                             r"model\.decoder\.sliding_window names no layers"):
        executors.load_decoder(decoder_names(bad))

    def every_layer(config):
        config["model"]["decoder"]["sliding_window"]["layers"] = [0, 1, 2]

    bad = _edited_copy(model_dir, tmp_path / "every", edit_config=every_layer)
    with pytest.raises(executors.ModelLoadError, match="at least one layer that keeps the whole sequence"):
        executors.load_decoder(decoder_names(bad))


# --------------------------------------------------------------------------------------------
# whole engines on the built directory

@pytest.mark.parametrize("engine_module, graph", [("oga", "standard"), ("oga", "fused"),
                                                  ("onnxruntime_genai", "standard")])
@pytest.mark.parametrize("name", ["ring02", "ring4"])
def test_engines_run_the_ring_model_like_the_reference(ring_dirs, name, engine_module, graph):
    """Greedy decoding of concurrent requests (a 57-token prompt prefilled in chunks wraps its ring
    several times) through a whole engine equals the numpy reference: oga's own engine, and
    onnxruntime-genai 0.18's (the contract's origin)."""
    from oga.models.reference import greedy
    if engine_module == "oga":
        import oga as og
        from oga import testing
        check = testing.check_invariants
    else:
        import onnxruntime_genai as og
        check = None
    model_dir, spec, _ = ring_dirs[name, graph]
    loaded = random_model(spec, seed=5)
    prompts = [list(range(3, 60)), [5, 9, 13], [7] * 20]
    engine = og.Engine(og.Model(model_dir))
    requests = []
    for prompt in prompts:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(20)
        request.begin_turn(np.asarray(prompt, np.int32) if engine_module != "oga" else prompt, options)
        requests.append(request)
    tokens, buffer = {}, engine.create_event_buffer(16)
    for _ in range(1000):
        if not engine.has_pending_requests():
            break
        for event in engine.run(buffer):
            assert event.request is not None, (event.flags, event.error_code)
            assert not event.flags & og.EngineEventFlags.FAILED, event.error_code
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens.setdefault(event.request, []).append(event.token)
        if check:
            check(engine)
    for prompt, request in zip(prompts, requests):
        assert tokens.get(request, []) == [t for t in greedy(loaded, prompt, 20) if t not in spec.eos_token_ids]


# --------------------------------------------------------------------------------------------
# builder

@pytest.mark.parametrize("graph", GRAPHS)
def test_build_writes_what_the_engine_needs(ring_dirs, graph):
    model_dir, spec, chunk = ring_dirs["ring02", graph]
    config = json.load(open(os.path.join(model_dir, "genai_config.json")))
    decoder = config["model"]["decoder"]
    assert decoder["sliding_window"] == {"window_size": 10, "layers": [0, 2]}
    assert decoder["inputs"]["block_table_windowed"] == "block_table_windowed"
    assert decoder["inputs"]["block_table"] == "block_table"
    assert decoder["inputs"]["past_key_names"] == "past_key_values.%d.key"
    assert decoder["outputs"]["present_value_names"] == "present.%d.value"
    assert decoder["state_groups"] == [{"kind": "paged_kv", "layer_ids": [0, 1, 2]}]
    assert config["search"]["chunk_size"] == chunk == 6
    assert config["engine"]["dynamic_batching"]["block_size"] == BLOCK

    model = onnx.load(os.path.join(model_dir, "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(model.graph.input) + list(model.graph.output)}
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    assert types["block_table_windowed"] == onnx.TensorProto.INT32
    assert dims["block_table_windowed"] == dims["block_table"] == ["batch_size", "max_blocks"]
    for i in range(3):
        first = "window_blocks" if i in (0, 2) else "num_blocks"
        assert dims[f"past_key_values.{i}.key"] == dims[f"present.{i}.value"] == [first, BLOCK, 2, 16]
    # every present cache comes straight out of the one node that reads its past input (in-place
    # update), and a ring layer's writes go through the windowed table
    producers = {out: node for node in model.graph.node for out in node.output}
    for i in range(3):
        for kind in ("key", "value"):
            node = producers[f"present.{i}.{kind}"]
            past = f"past_key_values.{i}.{kind}"
            assert [n for n in model.graph.node if past in n.input] == [node]
            if graph == "standard":
                assert node.op_type == "ScatterND" and node.input[0] == past
                assert ("ring" in node.input[1]) == (i in (0, 2))
            else:
                assert node.op_type == "PagedGroupQueryAttention" and past in node.input[3:5]
                assert node.input[5] == ("block_table_windowed" if i in (0, 2) else "block_table")
                window = next(a.i for a in node.attribute if a.name == "local_window_size")
                assert window == (10 if i in (0, 2) else -1)


def test_build_refuses_inconsistent_window_options(tmp_path):
    spec = ring_spec(3, (1,), 8)
    # without a chunk_size the ring is sized for max_scheduled_tokens per request and step
    out = build(None, str(tmp_path / "default"), random_spec=spec, block_size=BLOCK, max_scheduled_tokens=24)
    assert json.load(open(os.path.join(out, "genai_config.json")))["search"]["chunk_size"] == 24
    with pytest.raises(ValueError, match="chunk_size must be > 0"):
        build(None, str(tmp_path / "a"), random_spec=spec, block_size=BLOCK, chunk_size=0)
    for layers, match in (([0, 1, 2], "at least one layer that keeps the whole sequence"),
                          ([3], r"outside the decoder layers \[0, 3\)"), ([], "at least one layer"),
                          ([1, 1], "duplicates")):
        with pytest.raises(ValueError, match=match):
            random_model(ring_spec(3, layers, 8))
    with pytest.raises(ValueError, match="needs a sliding_window"):
        random_model(ring_spec(3, (1,), None))
    with pytest.raises(NotImplementedError, match="cpu"):
        build(None, str(tmp_path / "cuda"), random_spec=spec, target="cuda", chunk_size=4)
    with pytest.raises(NotImplementedError, match="cpu"):
        build_cuda_graph(spec, random_model(spec).weights)
    # a chunk size alone (no ring layers) is just the search default
    out = build(None, str(tmp_path / "plain"), random_spec=tiny_spec(), block_size=BLOCK, chunk_size=16)
    config = json.load(open(os.path.join(out, "genai_config.json")))
    assert config["search"]["chunk_size"] == 16 and "sliding_window" not in config["model"]["decoder"]


def test_cli_builds_a_ring_model(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = cli_main(["build", "--random", "--layers", "3", "--hidden", "32", "--heads", "4", "--kv-heads", "2",
                   "--vocab", "50", "--intermediate", "48", "--output", str(out), "--block-size", "4",
                   "--num-blocks", "20", "--sliding-window", "8", "--sliding-window-layers", "0,2",
                   "--chunk-size", "4"])
    assert rc == 0, capsys.readouterr().err
    config = json.load(open(out / "genai_config.json"))
    assert config["model"]["decoder"]["sliding_window"] == {"window_size": 8, "layers": [0, 2]}
    assert config["search"]["chunk_size"] == 4
    assert cli_main(["build", "--random", "--layers", "3", "--output", str(tmp_path / "x"),
                     "--sliding-window", "8", "--sliding-window-layers", "1"]) == 0
    assert json.load(open(tmp_path / "x" / "genai_config.json"))["search"]["chunk_size"] == 512
