"""SmolLM2-135M-Instruct end to end on CPU: built by oga.models, run by og.Engine."""
import numpy as np
import pytest
from tokenizers import Tokenizer

import oga as og
from oga import testing

PROMPTS = [
    "The capital of France is", "Water boils at a temperature of", "The largest planet in the solar system is",
    "def fibonacci(n):", "Once upon a time, there was a", "The chemical symbol for gold is",
    "1, 2, 3, 4, 5,", "In 1492, Christopher Columbus", "The opposite of hot is", "My favourite fruit is the",
    "Translate to French: cat ->", "The speed of light is approximately", "A haiku about the sea:",
    "import numpy as np\n", "The quick brown fox", "Monday, Tuesday, Wednesday,",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return Tokenizer.from_file(f"{smollm2_dir}/tokenizer.json")


def _submit(engine, token_lists, max_new):
    requests = []
    for tokens in token_lists:
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(max_new)
        request.begin_turn(np.asarray(tokens, dtype=np.int32), options)
        requests.append(request)
    return requests


def _drain(engine, buffer):
    streams = {}
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            assert event.request is not None, (event.flags, event.error_code)
            if event.token is not None:
                streams.setdefault(event.request, []).append(event.token)
    return streams


def test_capital_of_france(smollm2_dir, tokenizer):
    engine = og.Engine(og.Model(smollm2_dir))
    [request] = _submit(engine, [tokenizer.encode("The capital of France is").ids], 6)
    streams = _drain(engine, engine.create_event_buffer(8))
    assert "Paris" in tokenizer.decode(streams[request])


def test_sixteen_prompts_in_flight_equal_each_alone(smollm2_dir, tokenizer):
    model = og.Model(smollm2_dir)
    token_lists = [tokenizer.encode(p).ids for p in PROMPTS]
    alone = []
    for tokens in token_lists:
        engine = og.Engine(model)
        [request] = _submit(engine, [tokens], 10)
        alone.append(_drain(engine, engine.create_event_buffer(4)).get(request, []))
    engine = og.Engine(model)
    requests = _submit(engine, token_lists, 10)
    buffer = engine.create_event_buffer(32)
    together = {}
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.token is not None:
                together.setdefault(event.request, []).append(event.token)
        testing.check_invariants(engine)
    assert [together.get(r, []) for r in requests] == alone
    assert all(len(tokens) > 0 for tokens in alone)
    # All 16 were resident together: the batch really was continuous, not sequential.
    assert testing.engine_counters(engine)["committed_steps"] < sum(len(t) for t in alone)
