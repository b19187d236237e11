"""The ONNX Runtime executor: real paged decoders built by oga.models, run through og.Engine."""
import json
import statistics
import time

import numpy as np
import pytest

import oga as og
from oga import onnx_executor, testing
from oga.models import build
from oga.models.random_weights import random_model
from oga.models.reference import greedy
from oga.models.spec import DecoderSpec

SPEC = DecoderSpec(
    architecture="llama", vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5, context_length=256,
    tie_word_embeddings=True, qkv_bias=False, sliding_window=None, bos_token_id=1, eos_token_ids=[2],
    pad_token_id=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-llama")
    build(None, str(out), random_spec=SPEC, block_size=16, max_batch_size=8, max_scheduled_tokens=64, seed=3)
    return str(out)


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
    requests = []
    for prompt in prompts:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(max_new)
        request.begin_turn(prompt, options)
        requests.append(request)
    return requests


def test_concurrent_requests_match_the_numpy_reference(model_dir, reference_model):
    engine = og.Engine(og.Model(model_dir))
    requests = _submit(engine, PROMPTS, 12)
    tokens, _ = _drive(engine, engine.create_event_buffer(16))
    for prompt, request in zip(PROMPTS, requests):
        expected = [t for t in greedy(reference_model, prompt, 12) if t not in SPEC.eos_token_ids]
        assert tokens.get(request, []) == expected


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


def test_caches_are_written_in_place_and_never_move(model_dir):
    before = set(map(id, onnx_executor.OnnxEngineExecutor.live))
    engine = og.Engine(og.Model(model_dir))
    [executor] = [e for e in onnx_executor.OnnxEngineExecutor.live if id(e) not in before]
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
    before = set(map(id, onnx_executor.OnnxEngineExecutor.live))
    engine = og.Engine(og.Model(model_dir))
    [executor] = [e for e in onnx_executor.OnnxEngineExecutor.live if id(e) not in before]
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
    with pytest.raises(RuntimeError, match=r"tensor 'past_key_values\.0\.key' has shape .*expected block_size 32"):
        og.Model(str(broken))


def test_failure_classification():
    assert onnx_executor.classify_failure(MemoryError()) == onnx_executor.STATUS_CAPACITY_EXCEEDED
    assert onnx_executor.classify_failure(RuntimeError("std::bad_alloc")) == onnx_executor.STATUS_CAPACITY_EXCEEDED
    assert onnx_executor.classify_failure(RuntimeError("Invalid input dimensions")) == onnx_executor.STATUS_FATAL


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
