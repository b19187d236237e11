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


# MatMulNBits at accuracy_level 4 quantizes every activation block to int8: a 1e-6 difference in an
# input (a float32 summation order, or a kernel that is not batch-invariant, as ONNX Runtime 1.32's on
# an AVX2-only AMD EPYC) can move a code by one step, and after 30 layers SmolLM2's logits move by up
# to ~1 (measured: 0.74-0.82 on three prompts, while each engine's int8 rounding moves them 0.8-3.3
# from the same weights run with float activations).
INT8_ACTIVATION_NOISE = 1.5


def equal_up_to_a_near_tie(want, have, logits_of, noise):
    """True when the token streams are equal. Else asserts that they differ first where both choices
    are within `noise` of the top logit of `logits_of(want[:k])` (a third computation of the history
    so far, as noisy as the other two), and returns False: past that point the histories differ."""
    if have == want:
        return True
    k = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
    assert k < min(len(want), len(have)), f"one stream ends early: {want} vs {have}"
    logits = logits_of(want[:k])
    top = logits.max()
    assert logits[want[k]] >= top - noise and logits[have[k]] >= top - noise, (
        f"token {k}: {have[k]} (logit {logits[have[k]]:.4f}) against {want[k]} ({logits[want[k]]:.4f}), "
        f"top {top:.4f}")
    return False


def equal_to_the_reference_up_to_a_near_tie(reference_model, prompt, have, max_new, relative_noise):
    """The numpy reference (oga.models.reference) on `reference_model` decodes `max_new` greedy tokens
    after `prompt`; `have` must equal them up to a near-tie within relative_noise x the prompt's largest
    |logit| (equal_up_to_a_near_tie). Logits of a diverging history are replayed token by token, as an
    engine computes them: past LongRoPE's switch one pass over the whole history would rotate every key
    with the long factors."""
    from oga.models.reference import Reference

    reference = Reference(reference_model)
    logits = reference.step(prompt)[-1]
    noise = relative_noise * float(np.abs(logits).max())
    want = []
    for _ in range(max_new):
        want.append(int(np.argmax(logits)))
        logits = reference.step([want[-1]])[-1]

    def logits_of(done):
        replay = Reference(reference_model)
        history = replay.step(prompt)[-1]
        for token in done:
            history = replay.step([token])[-1]
        return history
    return equal_up_to_a_near_tie(want, have, logits_of, noise)
