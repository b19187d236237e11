"""Hybrid models: decode step time of 64 resident requests with the fixed state bound directly as
bank views vs forced gather / stage (python -m pytest bench/test_hybrid_fixed_state.py
--benchmark-only -s).

Both engines run the same model with the same 64 requests, all resident and decoding one token per
step (EOS masked). With direct binding the pool binds slots [0, 64) of the active bank as input and
of the inactive bank as output and publishes with a bank flip; the fallback copies every row's state
into gather rows before the step and every staged output into its inactive bank after it. Printed:
per-step time both ways and their ratio, for

  (1) a hybrid ONNX decoder (conv / recurrent / attention layers, recurrent state 4 x 64 x 64 fp32 =
      64 KiB per request and layer) on ONNX Runtime, and
  (2) the built-in test executor with 3 fixed tensors of 64 KiB rows (engine cost alone).
"""
import time

import numpy as np
import pytest

import oga
from oga import testing
from oga.models import build
from oga.models.random_weights import tiny_spec

ROWS = 64
STEPS = 20


def _resident_decoders(engine, prompts):
    requests = []
    for prompt in prompts:
        request = engine.create_request()
        options = oga.TurnOptions(request)
        options.set_min_generated_tokens(200)
        options.set_max_generated_tokens(200)
        request.begin_turn(np.asarray(prompt, np.int32), options)
        requests.append(request)
    buffer = engine.create_event_buffer(2 * ROWS)
    while testing.engine_counters(engine)["resident_requests"] < len(prompts):
        engine.run(buffer)
    engine.run(buffer)  # every request decoding
    return requests, buffer


def _step_ms(engine, buffer):
    start = testing.engine_counters(engine)
    begin = time.perf_counter_ns()
    for _ in range(STEPS):
        engine.run(buffer)
    wall = time.perf_counter_ns() - begin
    end = testing.engine_counters(engine)
    assert end["committed_steps"] - start["committed_steps"] == STEPS
    direct = end["fixed_state_direct_steps"] - start["fixed_state_direct_steps"]
    return wall / STEPS / 1e6, direct


def _compare(benchmark, make_engine, prompts, label):
    results = {}

    def measure():
        for mode in ("direct", "fallback"):
            engine = make_engine()
            if mode == "fallback":
                testing.set_fixed_state_fallback_only(engine, True)
            requests, buffer = _resident_decoders(engine, prompts)
            ms, direct = _step_ms(engine, buffer)
            assert direct == (STEPS if mode == "direct" else 0)
            results.setdefault(mode, []).append(ms)
            del requests

    benchmark.pedantic(measure, rounds=3, iterations=1)
    direct, fallback = min(results["direct"]), min(results["fallback"])
    print(f"\n{label}: {ROWS} resident decoders, decode step {direct:.3f} ms direct vs {fallback:.3f} ms "
          f"gather/stage (fallback / direct = {fallback / direct:.2f}x)")
    return direct, fallback


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    spec = tiny_spec(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=6, num_heads=4,
                     num_kv_heads=2, head_dim=64, context_length=512,
                     layer_types=["conv", "recurrent", "attention", "conv", "recurrent", "attention"], conv_kernel=4)
    path = tmp_path_factory.mktemp("hybrid_bench")
    build(None, str(path), random_spec=spec, block_size=16, max_batch_size=ROWS, max_scheduled_tokens=512, seed=3)
    return str(path)


def test_onnx_hybrid_decode_step_direct_vs_gather(benchmark, hybrid_dir):
    prompts = [[2 + (i * 7 + j) % 500 for j in range(8)] for i in range(ROWS)]
    direct, fallback = _compare(benchmark, lambda: oga.Engine(oga.Model(hybrid_dir)), prompts, "ONNX hybrid")
    assert fallback > direct


def test_engine_only_decode_step_direct_vs_gather(benchmark):
    def make_engine():
        model = testing.create_test_model(vocab_size=64, context_length=512, block_size=16, num_blocks=ROWS * 32,
                                          max_batch_size=ROWS, hybrid=([2], [0, 1], [1]),
                                          fixed_state_row_words=8192)
        return oga.Engine(model)

    prompts = [[2 + (i + j) % 60 for j in range(4)] for i in range(ROWS)]
    direct, fallback = _compare(benchmark, make_engine, prompts, "test executor, 3 x 64 KiB rows")
    assert fallback > direct
