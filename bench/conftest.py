"""Shared set-up for oga's benchmarks (run with: python -m pytest bench --benchmark-only)."""
import numpy as np
import pytest

import oga
from oga import testing


def decode_workload(num_requests, vocab_size=64, context_length=4096, block_size=16):
    """An engine with `num_requests` resident requests that have finished their prefill and decode
    one token each per step for thousands of steps (EOS masked by min_generated_tokens)."""
    model = testing.create_test_model(
        vocab_size=vocab_size,
        context_length=context_length,
        block_size=block_size,
        num_blocks=num_requests * (context_length // block_size),
        max_batch_size=num_requests,
    )
    engine = oga.Engine(model)
    requests = []
    for i in range(num_requests):
        request = engine.create_request()
        options = oga.TurnOptions(request)
        options.set_min_generated_tokens(context_length - 64)
        request.begin_turn(np.arange(2 + i % 7, dtype=np.int32) + 2, options)
        requests.append(request)
    buffer = engine.create_event_buffer(num_requests)
    # Prefill, then one decode step so every request is an active resident.
    while testing.engine_counters(engine)["resident_requests"] < num_requests:
        engine.run(buffer)
    engine.run(buffer)
    return engine, requests, buffer


@pytest.fixture
def idle_engine():
    engine = oga.Engine(testing.create_test_model())
    return engine, engine.create_event_buffer(8)
