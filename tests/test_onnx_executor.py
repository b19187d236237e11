"""The ONNX Runtime executor: real paged decoders built by oga.models, run through og.Engine."""
import dataclasses
import json
import os
import statistics
import time

import numpy as np
import pytest

import oga as og
from oga import executor as executors
from oga import testing
from oga.models import build
from oga.models.random_weights import random_model
from oga.models.reference import greedy
from greedy_runs import begin_all
from model_dirs import EXECUTOR_SPEC, executor_model_dir
from static_models import tiny_llama_static_dir  # noqa: F401  (fixture)

SPEC = EXECUTOR_SPEC


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return executor_model_dir(tmp_path_factory, "tiny-llama")


@pytest.fixture(scope="module")
def standard_model_dir(tmp_path_factory):
    """model_dir's model as the standard-op graph, which onnxruntime-genai 0.18 runs too."""
    return executor_model_dir(tmp_path_factory, "tiny-llama-standard", graph="standard")


@pytest.fixture(scope="module")
def reference_model():
    return random_model(SPEC, seed=3)


def _drive(engine, buffer, limit=10_000):
    tokens, reasons = {}, {}
    for _ in range(limit):
        if not engine.has_pending_requests():
            return tokens, reasons
        for event in engine.run(buffer):
            assert event.request is not None, event
            if event.flags & og.EngineEventFlags.TOKEN:
                tokens.setdefault(event.request, []).append(event.token)
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                reasons[event.request] = event.finish_reason
        testing.check_invariants(engine)
    raise AssertionError("the engine did not become idle")


PROMPTS = [[5, 9, 13], [7] * 20, [11, 12, 13, 14, 15, 16, 17, 18, 19], list(range(3, 50)), [3, 4]]


def _submit(engine, prompts, max_new):
    return begin_all(og, engine, prompts, max_new)


def test_concurrent_requests_match_the_numpy_reference(model_dir, reference_model):
    engine = og.Engine(og.Model(model_dir))
    requests = _submit(engine, PROMPTS, 12)
    tokens, _ = _drive(engine, engine.create_event_buffer(16))
    for prompt, request in zip(PROMPTS, requests):
        expected = [t for t in greedy(reference_model, prompt, 12) if t not in SPEC.eos_token_ids]
        assert tokens.get(request, []) == expected


WIDE_SPEC = dataclasses.replace(SPEC, vocab_size=3000)  # three blocks of 1024 logits, the last partial


def _block_maxima(logits):
    rows, vocab = logits.shape
    padded = np.full((rows, -(-vocab // 1024) * 1024), -np.inf, np.float32)
    padded[:, :vocab] = np.where(np.isnan(logits), -np.inf, logits)
    return padded.reshape(rows, -1, 1024).max(axis=2)


def test_the_lm_heads_block_maxima_reach_the_engine_and_change_no_token(tmp_path, monkeypatch):
    """oga's fused fp32 graph ends in oga.LogitsHead, whose logits_block_maxima output the executor
    binds beside the logits and hands to the engine's greedy selection: after a step the buffer holds
    each row's block maxima, and the greedy streams equal those of the same model with the maxima
    left unbound (the engine then reads whole rows) and the numpy reference's."""
    monkeypatch.setenv("OGA_EXECUTOR", "python")
    directory = str(tmp_path / "wide-vocab")
    build(None, directory, block_size=16, max_batch_size=8, max_scheduled_tokens=64, seed=3, random_spec=WIDE_SPEC)
    engine = og.Engine(og.Model(directory))
    executor = next(e for e in executors.OnnxEngineExecutor.live if e.decoder.path.startswith(directory))
    assert executor.decoder.block_maxima == "logits_block_maxima" and executor.block_maxima.shape == (8, 3)
    requests = _submit(engine, PROMPTS[:3], 8)
    buffer = engine.create_event_buffer(16)
    engine.run(buffer)  # the three prefills, one logits row each
    np.testing.assert_array_equal(executor.block_maxima[:3], _block_maxima(executor.logits[:3]))
    first = {event.request: event.token for event in buffer}
    tokens, _ = _drive(engine, buffer)
    with_maxima = [[first[r]] + tokens.get(r, []) for r in requests]
    reference = random_model(WIDE_SPEC, seed=3)
    assert with_maxima == [[t for t in greedy(reference, p, 8) if t not in SPEC.eos_token_ids] for p in PROMPTS[:3]]

    def unbound(self, rows):
        self.block_maxima = None

    monkeypatch.setattr(executors.OnnxEngineExecutor, "_new_block_maxima", unbound)
    engine = og.Engine(og.Model(directory))
    requests = _submit(engine, PROMPTS[:3], 8)
    tokens, _ = _drive(engine, engine.create_event_buffer(16))
    assert [tokens.get(r, []) for r in requests] == with_maxima


def test_each_request_alone_equals_the_batch(model_dir):
    model = og.Model(model_dir)
    alone = []
    for prompt in PROMPTS:
        engine = og.Engine(model)
        [request] = _submit(engine, [prompt], 10)
        alone.append(_drive(engine, engine.create_event_buffer(4))[0].get(request, []))
    engine = og.Engine(model)
    requests = _submit(engine, PROMPTS, 10)
    together, _ = _drive(engine, engine.create_event_buffer(1))
    assert [together.get(r, []) for r in requests] == alone


def test_caches_are_written_in_place_and_never_move(model_dir, monkeypatch):
    monkeypatch.setenv("OGA_EXECUTOR", "python")  # inspects the Python executor
    before = set(map(id, executors.OnnxEngineExecutor.live))
    engine = og.Engine(og.Model(model_dir))
    [executor] = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    addresses = [cache.ctypes.data for cache in executor.caches]
    assert all(not cache.any() for cache in executor.caches)  # allocated zeroed
    request = engine.create_request()
    request.begin_turn(PROMPTS[1])
    buffer = engine.create_event_buffer(4)
    for _ in range(5):
        engine.run(buffer)
    # ONNX Runtime wrote the new keys and values straight into the buffers oga bound.
    assert all(cache.any() for cache in executor.caches)
    assert [cache.ctypes.data for cache in executor.caches] == addresses


def _median_decode_step(model_dir, num_blocks):
    config = og.Config(model_dir)
    config.overlay(json.dumps({"engine": {"dynamic_batching": {"num_blocks": num_blocks}}}))
    engine = og.Engine(og.Model(config))
    requests = []
    for i in range(4):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_min_generated_tokens(150)
        request.begin_turn([5 + i, 6, 7], options)
        requests.append(request)
    buffer = engine.create_event_buffer(8)
    for _ in range(5):
        engine.run(buffer)
    times = []
    for _ in range(40):
        start = time.perf_counter()
        engine.run(buffer)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def test_step_time_does_not_grow_with_the_cache(model_dir):
    """A per-step copy of the caches would make a 16x larger pool (here ~100 MB) much slower."""
    small = _median_decode_step(model_dir, 256)
    large = _median_decode_step(model_dir, 256 * 16)
    assert large < small * 1.6 + 0.0005, (small, large)


def test_out_of_memory_is_rolled_back_and_other_failures_are_fatal(model_dir, monkeypatch):
    monkeypatch.setenv("OGA_EXECUTOR", "python")  # inspects the Python executor
    before = set(map(id, executors.OnnxEngineExecutor.live))
    engine = og.Engine(og.Model(model_dir))
    [executor] = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(4)
    request.begin_turn([5, 9, 13], options)
    buffer = engine.create_event_buffer(4)
    real_run = executor.session.run_with_iobinding

    def out_of_memory(binding):
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer")

    executor.session = type("S", (), {"run_with_iobinding": staticmethod(out_of_memory)})()
    [event] = list(engine.run(buffer))
    assert event.flags == og.EngineEventFlags.CAPACITY_BLOCKED
    assert event.error_code == og.EngineErrorCode.EXECUTION_CAPACITY_EXCEEDED
    testing.check_invariants(engine)

    def broken(binding):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running MatMul node")

    executor.session = type("S", (), {"run_with_iobinding": staticmethod(broken)})()
    [event] = list(engine.run(buffer))
    assert event.flags & og.EngineEventFlags.FAILED and event.request is request
    assert event.error_code == og.EngineErrorCode.ENGINE_EXECUTION_FAILURE
    with pytest.raises(RuntimeError, match="Model execution failed and the Engine is no longer healthy. Cause: "
                                           ".*Non-zero status code returned while running MatMul node"):
        engine.run(buffer)
    executor.session = type("S", (), {"run_with_iobinding": staticmethod(real_run)})()


def test_load_errors_name_the_file_the_tensor_and_the_expectation(model_dir, tmp_path):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    config = json.loads((broken / "genai_config.json").read_text())
    config["model"]["decoder"]["inputs"]["block_table"] = "no_such_input"
    (broken / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match=r"model\.onnx: the graph has no input 'no_such_input'"):
        og.Model(str(broken))
    config["model"]["decoder"]["inputs"]["block_table"] = "block_table"
    config["engine"]["dynamic_batching"]["block_size"] = 32
    (broken / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match=r"past_key_values\.0\.key dimension 1 is 16 in the graph, but "
                                           r"engine\.dynamic_batching\.block_size is 32\.$"):
        og.Model(str(broken))


def test_failure_classification():
    assert executors.classify_failure(MemoryError()) == executors.STATUS_CAPACITY_EXCEEDED
    assert executors.classify_failure(RuntimeError("std::bad_alloc")) == executors.STATUS_CAPACITY_EXCEEDED
    assert executors.classify_failure(RuntimeError("Invalid input dimensions")) == executors.STATUS_FATAL


def test_a_paged_graph_under_a_static_config_names_the_mismatch(model_dir, tmp_path):
    """Without engine.dynamic_batching the static path expects OGA's contiguous-cache contract."""
    import shutil
    static = tmp_path / "static"
    shutil.copytree(model_dir, static)
    config = json.loads((static / "genai_config.json").read_text())
    del config["engine"]
    (static / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match=r"model\.onnx: tensor 'input_ids' has shape \['num_tokens'\]; expected rank 2"):
        og.Model(str(static))


# ---------------------------------------------------------------------------------------------
# Cache geometry: every cache tensor the graph fixes against what the engine allocates
# ---------------------------------------------------------------------------------------------
def _redeclare(src, dst, change=None, config=None):
    """A copy of model directory `src` at `dst` whose graph declares other cache dimensions and whose
    genai_config.json `config(dict)` edits. `change(name, dims)` gets each cache input and output
    (past_key_values.* / present.*) with its dimensions (an int is fixed, a str symbolic) and returns
    new ones or None. Only the declarations change: the graph computes the same."""
    import shutil

    import onnx

    shutil.copytree(src, dst)
    if change is not None:
        path = os.path.join(dst, "model.onnx")
        graph = onnx.load(path)
        for value in list(graph.graph.input) + list(graph.graph.output):
            if not value.name.startswith(("past_key_values.", "present.")):
                continue
            declared = value.type.tensor_type.shape.dim
            dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in declared]
            new = change(value.name, list(dims))
            for d, v in zip(declared, new or dims):
                if isinstance(v, int):
                    d.dim_value = v
                else:
                    d.dim_param = v
        onnx.save(graph, path)
    if config is not None:
        config_path = os.path.join(dst, "genai_config.json")
        with open(config_path) as f:
            cfg = json.load(f)
        config(cfg)
        with open(config_path, "w") as f:
            json.dump(cfg, f)
    return str(dst)


def _set(axis, value, names=None):
    """A `change` for _redeclare: dimension `axis` of every cache (or of those in `names`) := value."""
    def change(name, dims):
        if names is None or name in names:
            dims[axis] = value
            return dims
        return None
    return change


def _decoder(key, value):
    return lambda cfg: cfg["model"]["decoder"].__setitem__(key, value)


def _batching(**values):
    def edit(cfg):
        batching = cfg["engine"]["dynamic_batching"]
        for key, value in values.items():
            if value is None:
                batching.pop(key, None)
            else:
                batching[key] = value
    return edit


def _tokens(model_or_engine, prompts=PROMPTS[:3], max_new=6):
    engine = model_or_engine if isinstance(model_or_engine, og.Engine) else og.Engine(model_or_engine)
    requests = _submit(engine, prompts, max_new)
    tokens, _ = _drive(engine, engine.create_event_buffer(8))
    return [tokens.get(r, []) for r in requests]


def _without_heads(cfg):
    del cfg["model"]["decoder"]["num_key_value_heads"]


WIDTH = "the KV cache's head width is 16 (dimension 3 of past_key_values.0.key)"
LOAD_MISMATCHES = {
    # model_dir: blocks of 16 slots, 2 KV heads of 16, num_blocks 128 (8 requests x 256 / 16)
    "num_blocks": (dict(change=_set(0, 64)),
                   "past_key_values.0.key dimension 0 is 64 in the graph, but engine.dynamic_batching.num_blocks is 128."),
    "num_blocks of one output": (dict(change=_set(0, 100, {"present.1.value"})),
                                 "present.1.value dimension 0 is 100 in the graph, but engine.dynamic_batching."
                                 "num_blocks is 128."),
    "block_size": (dict(config=_batching(block_size=32)),
                   "past_key_values.0.key dimension 1 is 16 in the graph, but engine.dynamic_batching.block_size is 32."),
    "block_size of one output": (dict(change=_set(1, 8, {"present.0.key"})),
                                 "present.0.key dimension 1 is 8 in the graph, but engine.dynamic_batching.block_size "
                                 "is 16."),
    "kv heads": (dict(config=_decoder("num_key_value_heads", 4)),
                 "past_key_values.0.key dimension 2 is 2 in the graph, but model.decoder.num_key_value_heads is 4."),
    "kv heads of one layer": (dict(change=_set(2, 1, {"past_key_values.1.value", "present.1.value"})),
                              "past_key_values.1.value dimension 2 is 1 in the graph, but "
                              "model.decoder.num_key_value_heads is 2."),
    "kv heads without the config's": (dict(change=_set(2, 1, {"present.1.key"}), config=_without_heads),
                                      "present.1.key dimension 2 is 1 in the graph, but the KV cache has 2 KV heads "
                                      "(dimension 2 of past_key_values.0.key)."),
    "kv heads symbolic and unset": (dict(change=_set(2, "kv_heads"), config=_without_heads),
                                    "past_key_values.0.key dimension 2 (the KV heads) is 'kv_heads' in the graph, and "
                                    "model.decoder.num_key_value_heads is not set, so the engine cannot size the KV "
                                    "cache."),
    "head width": (dict(change=_set(3, 8, {"present.1.value"})), f"present.1.value dimension 3 is 8 in the graph, but "
                                                                   f"{WIDTH}."),
}


@pytest.mark.parametrize("case", LOAD_MISMATCHES)
def test_cache_geometry_the_graph_contradicts_is_refused_at_load(model_dir, tmp_path, case):
    """og.Model refuses, naming the tensor, the dimension, the graph's value and the engine's (0.18
    loads these and its engine fails at the first step, or runs on a cache of the config's shape)."""
    edits, message = LOAD_MISMATCHES[case]
    broken = _redeclare(model_dir, tmp_path / "broken", **edits)
    with pytest.raises(RuntimeError) as info:
        og.Model(broken)
    assert str(info.value) == f"{broken}/model.onnx: {message}"


def test_a_symbolic_head_width_is_refused_with_0_18s_text(standard_model_dir, tmp_path):
    """0.18 reads the head width from the graph too, and refuses a symbolic one (at og.Engine; oga at
    og.Model)."""
    import onnxruntime_genai as og18

    broken = _redeclare(standard_model_dir, tmp_path / "broken", _set(3, "head_width"))
    expected = "Paged cache input must have rank four and a static physical head width: past_key_values.0.key"
    with pytest.raises(RuntimeError) as ours:
        og.Model(broken)
    with pytest.raises(RuntimeError) as theirs:
        og18.Engine(og18.Model(broken))
    assert str(ours.value) == str(theirs.value) == expected


def test_0_18_loads_a_contradicted_geometry_and_fails_at_the_first_step(standard_model_dir, tmp_path):
    """The side of 0.18 that the load-time refusals replace (README, deliberate differences)."""
    import onnxruntime_genai as og18

    from greedy_runs import begin_all

    for name, edits in (("blocks", dict(change=_set(0, 64))), ("heads", dict(config=_decoder("num_key_value_heads", 4)))):
        directory = _redeclare(standard_model_dir, tmp_path / name, **edits)
        engine = og18.Engine(og18.Model(directory))
        requests = begin_all(og18, engine, [PROMPTS[0]], 4)
        flags = [e.flags for e in engine.run(engine.create_event_buffer(8))]
        assert any(f & og18.EngineEventFlags.FAILED for f in flags), flags
        del requests
        with pytest.raises(RuntimeError, match=f"dimension {0 if name == 'blocks' else 2} is"):
            og.Model(directory)


def _cache_only_decoder(directory, cache_types, vocab=97, layers=2, shape=("num_blocks", 16, 2, 16)):
    """A paged-contract graph that only passes its caches through (present = Cast(past)) and writes
    zero logits, with model_dir's config: enough for load-time checks of cache types, which a real
    graph cannot declare differently. `cache_types` maps a cache name to its ONNX element type
    (float elsewhere)."""
    from onnx import TensorProto, helper

    info = helper.make_tensor_value_info
    inputs = [info("input_ids", TensorProto.INT64, ["num_tokens"]),
              info("cumulative_sequence_lengths", TensorProto.INT32, ["batch_size + 1"]),
              info("past_sequence_lengths", TensorProto.INT32, ["batch_size"]),
              info("block_table", TensorProto.INT32, ["batch_size", "max_blocks"]),
              info("attention_metadata", TensorProto.INT32, [3])]
    outputs = [info("logits", TensorProto.FLOAT, ["batch_size", vocab])]
    nodes = [helper.make_node("Shape", ["past_sequence_lengths"], ["rows"]),
             helper.make_node("Concat", ["rows", "vocab"], ["logits_shape"], axis=0),
             helper.make_node("ConstantOfShape", ["logits_shape"], ["logits"])]
    for layer in range(layers):
        for kind in ("key", "value"):
            past, present = f"past_key_values.{layer}.{kind}", f"present.{layer}.{kind}"
            past_type = cache_types.get(past, TensorProto.FLOAT)
            present_type = cache_types.get(present, TensorProto.FLOAT)
            inputs.append(info(past, past_type, list(shape)))
            outputs.append(info(present, present_type, list(shape)))
            nodes.append(helper.make_node("Cast", [past], [present], to=present_type))
    vocab_tensor = helper.make_tensor("vocab", TensorProto.INT64, [1], [vocab])
    graph = helper.make_graph(nodes, "cache_only", inputs, outputs, initializer=[vocab_tensor])
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), os.path.join(directory, "model.onnx"))


@pytest.mark.parametrize("types,message", [
    ({"past_key_values.1.key": 10, "present.1.key": 10},
     "past_key_values.1.key has type tensor(float16) in the graph, but the KV cache is tensor(float) (the type of "
     "past_key_values.0.key)."),
    ({"present.0.value": 10},
     "present.0.value has type tensor(float16) in the graph, but the KV cache is tensor(float) (the type of "
     "past_key_values.0.key)."),
])
def test_a_cache_of_another_type_is_refused_at_load(model_dir, tmp_path, types, message):
    directory = _redeclare(model_dir, tmp_path / "cache-only")
    _cache_only_decoder(directory, types)
    with pytest.raises(RuntimeError) as info:
        og.Model(directory)
    assert str(info.value) == f"{directory}/model.onnx: {message}"
    _cache_only_decoder(directory, {})
    og.Engine(og.Model(directory))  # the same graph with one type loads


def test_an_automatic_block_count_the_graph_contradicts_is_refused_at_engine_creation(model_dir, tmp_path):
    """Without num_blocks the count is known only when the engine sizes the pool."""
    auto = _batching(num_blocks=None, gpu_utilization_factor=0.5)
    broken = _redeclare(model_dir, tmp_path / "broken", _set(0, 64), config=auto)
    model = og.Model(broken)
    with pytest.raises(RuntimeError) as info:
        og.Engine(model)
    # 128 blocks: what 8 requests of 256 tokens can use, far below half the memory
    assert str(info.value) == (
        f"The model executor could not prepare the engine: {broken}/model.onnx: past_key_values.0.key dimension 0 is "
        "64 in the graph, but the engine sized the KV cache to 128 blocks (engine.dynamic_batching."
        "gpu_utilization_factor); set engine.dynamic_batching.num_blocks to the graph's count.")


def test_matching_fixed_and_symbolic_geometries_load_and_generate(model_dir, tmp_path):
    """The same graph declaring every cache dimension fixed (as the engine allocates it), or block
    size and KV heads symbolic (the engine's come from the config, as in 0.18), runs token for token
    like the original; so does automatic sizing over a fixed block count that it matches."""
    expected = _tokens(og.Model(model_dir))

    def fixed(name, dims):
        return [128, 16, 2, 16]

    def symbolic(name, dims):
        return [dims[0], "block_size", "kv_heads", dims[3]]

    for name, change, config in (
            ("fixed", fixed, None), ("symbolic", symbolic, None),
            ("auto", fixed, _batching(num_blocks=None, gpu_utilization_factor=0.5))):
        directory = _redeclare(model_dir, tmp_path / name, change, config=config)
        model = og.Model(directory)
        assert _tokens(model) == expected, name


def test_sliding_window_ring_blocks_the_graph_fixes(tmp_path):
    """A ring layer's dimension 0 is the engine's window blocks: R = ceil((C + W - 1) / block_size)
    per request (W 10, C 6, blocks of 4: R 4) for each of max_batch_size 4 requests."""
    from oga.models.random_weights import tiny_spec

    spec = tiny_spec(vocab_size=97, num_layers=2, sliding_window=10, sliding_window_layers=[1], context_length=128)
    out = str(tmp_path / "ring")
    build(None, out, random_spec=spec, block_size=4, chunk_size=6, max_batch_size=4, max_scheduled_tokens=64, seed=5)
    expected = _tokens(og.Model(out))
    ring = {"past_key_values.1.key", "past_key_values.1.value", "present.1.key", "present.1.value"}
    directory = _redeclare(out, tmp_path / "ring-fixed", _set(0, 16, ring))
    assert _tokens(og.Model(directory)) == expected
    directory = _redeclare(out, tmp_path / "ring-broken", _set(0, 12, ring))
    model = og.Model(directory)
    with pytest.raises(RuntimeError) as info:
        og.Engine(model)
    assert str(info.value) == (
        f"The model executor could not prepare the engine: {directory}/model.onnx: past_key_values.1.key dimension 0 "
        "is 12 in the graph, but the engine allocates 16 ring blocks for the sliding-window layers (4 per request, "
        "from model.decoder.sliding_window.window_size and search.chunk_size, for engine.dynamic_batching."
        "max_batch_size 4 requests).")


STATIC_LOAD_MISMATCHES = {
    # OGA's builder: [batch_size, 2, past_sequence_length, kv_cache_dim], head_size 16 in the config
    "kv heads": (dict(config=_decoder("num_key_value_heads", 4)),
                 "past_key_values.0.key dimension 1 is 2 in the graph, but model.decoder.num_key_value_heads is 4."),
    "kv heads of one layer": (dict(change=_set(1, 1, {"past_key_values.1.value"})),
                              "past_key_values.1.value dimension 1 is 1 in the graph, but "
                              "model.decoder.num_key_value_heads is 2."),
    "head size": (dict(change=_set(3, 8, {"past_key_values.1.key"})),
                  "past_key_values.1.key dimension 3 is 8 in the graph, but model.decoder.head_size is 16."),
    "head size symbolic and unset": (dict(config=lambda cfg: cfg["model"]["decoder"].pop("head_size")),
                                     "past_key_values.0.key dimension 3 (the head size) is 'kv_cache_dim' in the graph, "
                                     "and model.decoder.head_size is not set, so the engine cannot size the KV cache."),
}


@pytest.mark.parametrize("case", STATIC_LOAD_MISMATCHES)
def test_static_cache_geometry_the_graph_contradicts_is_refused_at_load(tiny_llama_static_dir, tmp_path, case):
    edits, message = STATIC_LOAD_MISMATCHES[case]
    broken = _redeclare(tiny_llama_static_dir, tmp_path / "broken", **edits)
    with pytest.raises(RuntimeError) as info:
        og.Model(broken)
    assert str(info.value) == f"{broken}/model.onnx: {message}"


def _static_batch(size):
    return lambda cfg: cfg.setdefault("engine", {}).__setitem__("static_batching", {"max_batch_size": size})


PAST = {f"past_key_values.{layer}.{kind}" for layer in (0, 1) for kind in ("key", "value")}


@pytest.mark.parametrize("edits,message", [
    (dict(change=_set(0, 1)),
     "past_key_values.0.key dimension 0 is 1 in the graph, but the engine binds one row per request of a batch, 1 to 4 "
     "rows (engine.static_batching.max_batch_size is 4); the graph's batch dimension must be symbolic."),
    (dict(change=_set(0, 2), config=_static_batch(2)),
     "past_key_values.0.key dimension 0 is 2 in the graph, but the engine binds one row per request of a batch, 1 to 2 "
     "rows (engine.static_batching.max_batch_size is 2); the graph's batch dimension must be symbolic."),
    (dict(change=_set(0, 2), config=_static_batch(1)),
     "past_key_values.0.key dimension 0 is 2 in the graph, but the engine binds 1 row "
     "(engine.static_batching.max_batch_size is 1)."),
    (dict(change=_set(2, 256, PAST)),
     "past_key_values.0.key dimension 2 is 256 in the graph, but the engine allocates 512 positions per request "
     "(search.max_length, else model.context_length)."),
])
def test_static_cache_dimensions_the_engine_decides_are_checked_at_engine_creation(tiny_llama_static_dir, tmp_path,
                                                                                  edits, message):
    broken = _redeclare(tiny_llama_static_dir, tmp_path / "broken", **edits)
    model = og.Model(broken)
    with pytest.raises(RuntimeError) as info:
        og.Engine(model)
    assert str(info.value) == f"The model executor could not prepare the engine: {broken}/model.onnx: {message}"


def test_static_matching_fixed_geometry_loads_and_generates(tiny_llama_static_dir, tmp_path):
    """Every cache dimension fixed as the engine allocates it (one row: max_batch_size 1; 512
    positions; 2 heads of 16) runs token for token like the symbolic original."""
    prompts = [[100, 200, 300], [7, 8, 9, 10]]
    original = _redeclare(tiny_llama_static_dir, tmp_path / "original", config=_static_batch(1))
    expected = _tokens(og.Model(original), prompts)
    fixed = _redeclare(tiny_llama_static_dir, tmp_path / "fixed", lambda name, dims: [1, 2, 512, 16],
                       config=_static_batch(1))
    assert _tokens(og.Model(fixed), prompts) == expected
    assert all(expected)
