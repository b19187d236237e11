"""Sampler cost per row at SmolLM2's vocabulary (49152) and per 64-row step: greedy, top-k 50,
top-p 0.9 (goal: sampling under 5% of a SmolLM2 decode step at batch 64). Engine time per step is
the transaction's wall time minus the executor's, so the test executor's own logits cost (large at
this vocabulary) is not counted."""
import numpy as np
import pytest

import oga as og
from oga import testing

ROWS = 64
STEPS = 40


def _engine(policy):
    model = testing.create_test_model(vocab_size=49152, eos_token_id=2, context_length=256, block_size=16,
                                      num_blocks=ROWS * 16, max_batch_size=ROWS)
    engine = og.Engine(model)
    requests = []  # held: a dropped Request is abandoned and reclaimed
    for i in range(ROWS):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_min_generated_tokens(200)
        for name, value in policy.items():
            getattr(options, f"set_{name}")(value)
        request.begin_turn(np.arange(3 + i % 5, dtype=np.int32) + 3, options)
        requests.append(request)
    buffer = engine.create_event_buffer(ROWS)
    while testing.engine_counters(engine)["resident_requests"] < ROWS:
        engine.run(buffer)
    engine.run(buffer)
    return engine, buffer, requests


@pytest.mark.parametrize("name,policy", [
    ("greedy", {}),
    ("top_k_50", {"do_sample": True, "top_k": 50, "seed": 1}),
    ("top_p_0.9", {"do_sample": True, "top_k": 0, "top_p": 0.9, "seed": 1}),
])
def test_sampler_cost_64_rows(benchmark, name, policy):
    engine, buffer, requests = _engine(policy)
    before = testing.engine_counters(engine)
    benchmark.pedantic(lambda: engine.run(buffer), rounds=STEPS, iterations=1)
    after = testing.engine_counters(engine)
    steps = after["committed_steps"] - before["committed_steps"]
    engine_ns = (after["step_ns"] - before["step_ns"]) - (after["executor_ns"] - before["executor_ns"])
    per_step = engine_ns / steps / 1000.0
    benchmark.extra_info.update(engine_us_per_step=per_step, engine_us_per_row=per_step / ROWS)
    print(f"\n{name}: engine {per_step:.0f} us per 64-row step, {per_step / ROWS:.1f} us per row")
