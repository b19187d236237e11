"""oga.serve.engine_owner: one engine on its owner thread, driven from an asyncio event loop.

On oga's deterministic test model (no ONNX Runtime): turns submitted from the loop give the tokens
the same engine gives when driven directly; cancelling frees the request's blocks; a fatal engine
failure ends every live turn as failed and refuses new ones; stop() cancels what runs and refuses
what comes after; a refused begin_turn is answered Rejected.
"""
import asyncio

import numpy as np
import pytest

import oga as og
import oga.testing as ogt
from greedy_runs import begin_all, drain
from oga.serve.engine_owner import Begun, EngineOwner, Finished, Rejected, ServiceUnavailable, Token, TurnSpec

PROMPTS = [[5, 9, 13], [7, 3], [11, 12, 13, 14, 15], [2, 4, 6, 8], [20, 21], [30, 31, 32]]


def _owner(model):
    owner = EngineOwner(lambda: (model, None))
    owner.start(timeout=30)
    return owner


def _spec(prompt, max_tokens, **policy):
    return TurnSpec(np.asarray(prompt, np.int32), max_tokens, {k: (v,) for k, v in policy.items()})


async def _events(turn, until=Finished):
    """The turn's events up to and including the first `until` (or Rejected)."""
    events = []
    while True:
        event = await asyncio.wait_for(turn.events.get(), 30)
        events.append(event)
        if isinstance(event, (until, Rejected)):
            return events


def test_turns_from_the_event_loop_give_the_directly_driven_tokens():
    model = ogt.create_test_model()
    engine = og.Engine(model)
    expected = drain(og, engine, begin_all(og, engine, PROMPTS, 12))
    owner = _owner(model)
    try:
        async def run_all():
            turns = [owner.submit(_spec(p, 12)) for p in PROMPTS]
            return await asyncio.gather(*(_events(t) for t in turns))

        results = asyncio.run(run_all())
    finally:
        owner.stop(timeout=30)
    for prompt, events, tokens in zip(PROMPTS, results, expected):
        assert isinstance(events[0], Begun)
        assert [e.token for e in events if isinstance(e, Token)] == tokens
        finished = events[-1]
        assert finished.reason in (int(og.FinishReason.EOS), int(og.FinishReason.MAX_GENERATED_TOKENS))
        assert (finished.prompt_tokens, finished.generated_tokens) == (len(prompt), len(tokens))
    assert not owner.healthy   # stopped


def _stalling_model(after_runs):
    """A test model whose model runs fail retryably from run `after_runs` on: a turn that started
    stays live (its steps roll back and run again), so a test can act on it without racing it."""
    model = ogt.create_test_model()
    ogt.inject_fault(model, "execute", "retryable", skip=after_runs, count=10 ** 9)
    return model


def test_cancel_mid_turn_frees_the_request_and_posts_cancelled():
    owner = _owner(_stalling_model(after_runs=3))
    try:
        async def cancel_after_first_token():
            turn = owner.submit(_spec([5, 9, 13], 100))
            events = await _events(turn, until=Token)
            owner.cancel(turn)
            events += await _events(turn)
            owner.cancel(turn)                  # idempotent: the turn is gone
            return events

        events = asyncio.run(cancel_after_first_token())
        assert isinstance(events[0], Begun)
        finished = events[-1]
        assert finished.reason == int(og.FinishReason.CANCELLED)
        assert 1 <= finished.generated_tokens == sum(isinstance(e, Token) for e in events) < 100
        assert owner.stats.free_blocks == owner.stats.total_blocks > 0
        assert owner.stats.resident_requests == owner.stats.waiting_requests == 0
        assert owner.healthy
    finally:
        owner.stop(timeout=30)


def test_a_refused_begin_turn_is_rejected_and_changes_nothing():
    owner = _owner(ogt.create_test_model(vocab_size=64))
    try:
        async def scenario():
            refused = await _events(owner.submit(_spec([5, 900], 4)))        # 900: not in the vocabulary
            accepted = await _events(owner.submit(_spec([5, 9, 13], 4)))
            return refused, accepted

        refused, accepted = asyncio.run(scenario())
        assert len(refused) == 1 and isinstance(refused[0], Rejected) and not refused[0].unavailable
        assert "outside the model's vocabulary" in refused[0].message
        assert isinstance(accepted[0], Begun) and isinstance(accepted[-1], Finished)
    finally:
        owner.stop(timeout=30)


def test_a_fatal_engine_failure_fails_live_turns_and_refuses_new_ones():
    model = ogt.create_test_model()
    ogt.inject_fault(model, "execute", "fatal", skip=4)     # the fifth model run fails
    owner = _owner(model)
    try:
        async def scenario():
            turns = [owner.submit(_spec(p, 50, min_generated_tokens=50)) for p in PROMPTS[:3]]
            return await asyncio.gather(*(_events(t) for t in turns))

        results = asyncio.run(scenario())
        for events in results:
            assert any(isinstance(e, Token) for e in events)
            assert events[-1].reason == int(og.FinishReason.FAILED) and events[-1].error
        assert not owner.healthy and "failed" in owner.failure

        async def submit_again():
            owner.submit(_spec([5], 2))

        with pytest.raises(ServiceUnavailable):
            asyncio.run(submit_again())
    finally:
        owner.stop(timeout=30)


def test_stop_cancels_live_turns_and_refuses_later_ones():
    owner = _owner(_stalling_model(after_runs=3))

    async def scenario():
        turn = owner.submit(_spec([5, 9, 13], 100))
        await _events(turn, until=Token)
        await asyncio.get_running_loop().run_in_executor(None, owner.stop, 30)
        events = await _events(turn)
        with pytest.raises(ServiceUnavailable):
            owner.submit(_spec([5], 2))
        return events

    events = asyncio.run(scenario())
    assert events[-1].reason == int(og.FinishReason.CANCELLED)


def test_a_model_that_fails_to_load_fails_start():
    def load():
        raise RuntimeError("no such model")

    owner = EngineOwner(load)
    with pytest.raises(RuntimeError, match="no such model"):
        owner.start(timeout=30)
    assert not owner.healthy
