"""Greedy turns through a whole engine, oga's or onnxruntime-genai 0.18's (the same code drives
both: only the module differs), for the tests that compare model directories token by token."""
import numpy as np

import oga as og
from oga import testing


def begin_all(og_module, engine, prompts, max_new):
    """A request per prompt, each begun with a greedy turn of at most max_new tokens."""
    requests = []
    for prompt in prompts:
        request = engine.create_request()
        options = og_module.TurnOptions(request)
        options.set_max_generated_tokens(max_new)
        request.begin_turn(np.asarray(prompt, np.int32), options)
        requests.append(request)
    return requests


def drain(og_module, engine, requests, limit=5000):
    """Runs the engine until it is idle; returns each request's tokens. No event may fail; oga's
    engine is checked for its invariants after every run."""
    tokens = {}
    buffer = engine.create_event_buffer(16)
    for _ in range(limit):
        if not engine.has_pending_requests():
            return [tokens.get(id(r), []) for r in requests]
        for event in engine.run(buffer):
            assert event.request is not None, (event.flags, event.error_code)
            assert not event.flags & og_module.EngineEventFlags.FAILED, event.error_code
            if event.flags & og_module.EngineEventFlags.TOKEN:
                tokens.setdefault(id(event.request), []).append(event.token)
        if og_module is og:
            testing.check_invariants(engine)
    raise AssertionError("the engine did not finish")


def greedy(og_module, model_dir, prompts, max_new):
    """Every prompt concurrently on a new engine over `model_dir`, greedy, up to max_new tokens (an
    EOS ends a turn). Returns the tokens of each."""
    engine = og_module.Engine(og_module.Model(str(model_dir)))
    return drain(og_module, engine, begin_all(og_module, engine, prompts, max_new))
