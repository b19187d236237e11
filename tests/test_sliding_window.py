"""Sliding-window paged layers kept in a ring (seed: "Sliding-window paged layers").
The test executor keeps a ring as a ring layer would: each step's positions are written through
block_table_windowed, then every query must find the W - 1 positions before it in its ring slots; an
undersized ring or a wrong ring table is a fatal execution failure. Tokens come from the full layers'
state chain, so they must equal the greedy oracle."""
import random

import pytest

import oga as og
import oga.testing as ogt
from helpers import OracleSequence, drive, key, turn_options


def ring_engine(window=8, chunk=4, block_size=4, **cfg):
    cfg.setdefault("context_length", 256)
    cfg.setdefault("num_blocks", 256)
    model = ogt.create_test_model(sliding_window=(window, [1]), block_size=block_size, chunk_size=chunk, **cfg)
    return model, og.Engine(model)


@pytest.mark.parametrize("window,chunk,block_size", [(8, 4, 4), (5, 3, 4), (16, 8, 4), (3, 1, 2), (12, 16, 8)])
def test_long_sequences_wrap_the_ring_many_times(window, chunk, block_size):
    _, engine = ring_engine(window, chunk, block_size, max_batch_size=8)
    rng = random.Random(window * 100 + chunk)
    prompts = [[rng.randrange(2, 64) for _ in range(rng.randrange(10, 60))] for _ in range(6)]
    requests = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=80))
        requests.append(r)
    evs = drive(engine)  # a ring failure poisons the engine: the events would say Failed
    for r, p in zip(requests, prompts):
        toks, _ = OracleSequence(max_session=256).turn(p, max_gen=80)
        assert [e.token for e in evs if e.request is r and e.flags & 1] == toks
    assert ogt.engine_counters(engine)["model_runs"] > 0


def test_prefill_steps_never_exceed_the_ring_chunk():
    _, engine = ring_engine(window=8, chunk=4, max_scheduled_tokens=64)
    r = engine.create_request()
    r.begin_turn(list(range(2, 40)), turn_options(r, max_gen=2))
    buffer = engine.create_event_buffer(8)
    widths = []
    while engine.has_pending_requests():
        engine.run(buffer)
        inputs = ogt.last_step_inputs(engine)
        cumulative = list(inputs["cumulative_sequence_lengths"])
        widths += [b - a for a, b in zip(cumulative, cumulative[1:])]
    assert max(widths) == 4


def test_a_smaller_request_chunk_is_kept_and_a_larger_one_capped():
    model, engine = ring_engine(window=8, chunk=4, max_scheduled_tokens=64)
    for chunk, widest in ((2, 2), (9, 4)):
        params = og.GeneratorParams(model)
        params.set_search_options(chunk_size=chunk, max_length=200)
        r = engine.create_request(params)
        r.begin_turn(list(range(2, 30)), turn_options(r, max_gen=2))
        buffer = engine.create_event_buffer(8)
        widths = []
        while engine.has_pending_requests():
            engine.run(buffer)
            cumulative = list(ogt.last_step_inputs(engine)["cumulative_sequence_lengths"])
            widths += [b - a for a, b in zip(cumulative, cumulative[1:])]
        assert max(widths) == widest, chunk
        r.close()


def test_table_slots_and_their_rings_are_reused_across_requests():
    _, engine = ring_engine(window=6, chunk=3, max_batch_size=3)
    rng = random.Random(5)
    for wave in range(4):
        prompts = [[rng.randrange(2, 64) for _ in range(rng.randrange(5, 30))] for _ in range(3)]
        requests = []
        for p in prompts:
            r = engine.create_request()
            r.begin_turn(p, turn_options(r, max_gen=20))
            requests.append(r)
        evs = drive(engine)
        for r, p in zip(requests, prompts):
            assert [e.token for e in evs if e.request is r and e.flags & 1] == \
                OracleSequence(max_session=256).turn(p, max_gen=20)[0]
            r.close()


def test_drafts_fit_inside_the_ring_chunk():
    _, engine = ring_engine(window=8, chunk=4, per_token_logits=True)
    assert engine.max_draft_tokens_per_proposal() == 3  # mandatory token + 3 drafts = the chunk
    prompt = [5, 9, 13]
    expected, _ = OracleSequence(max_session=256).turn(prompt, max_gen=30)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=30))
    buffer = engine.create_event_buffer(64)
    got = []
    while engine.has_pending_requests():
        if got:
            r.set_draft_tokens(expected[len(got):len(got) + 3])
        got += [e.token for e in engine.run(buffer) if e.flags & 1]
        ogt.check_invariants(engine)
    assert got == expected


@pytest.mark.parametrize("fault", [dict(phase="execute", kind="retryable"), dict(phase="sample")],
                         ids=["execute", "sample"])
def test_rollback_keeps_the_ring_consistent(fault):
    prompts = [list(range(2, 30)), list(range(10, 25))]

    def run(with_fault):
        model, engine = ring_engine(window=8, chunk=4)
        if with_fault:
            ogt.inject_fault(model, skip=5, count=3, **fault)
        requests = []
        for p in prompts:
            r = engine.create_request()
            r.begin_turn(p, turn_options(r, max_gen=20))
            requests.append(r)
        evs = drive(engine)
        return [[key(e) for e in evs if e.request is r] for r in requests]

    assert run(True) == run(False)


def test_enabling_conditions_and_their_messages():
    with pytest.raises(RuntimeError, match=r"^This model holds its sliding-window layers in a ring of blocks, which only "
                                           r"works if the prefill is chunked\. Set search\.chunk_size in "
                                           r"genai_config\.json\.$"):
        og.Engine(ogt.create_test_model(sliding_window=(8, [1])))
    with pytest.raises(RuntimeError, match=r"^A paged model needs at least one layer that keeps the whole sequence\.$"):
        og.Engine(ogt.create_test_model(sliding_window=(8, [0, 1]), chunk_size=4))
    with pytest.raises(RuntimeError, match=r"^Prefix caching does not yet support sliding-window paged KV rings\.$"):
        og.Engine(ogt.create_test_model(sliding_window=(8, [1]), chunk_size=4, prefix_caching=True))
    # Without the key, prefix caching is simply off for ring models.
    _, engine = ring_engine(prefix_caching=None)
    r = engine.create_request()
    r.begin_turn(list(range(2, 20)), turn_options(r, max_gen=2))
    drive(engine)
    r2 = engine.create_request()
    r2.begin_turn(list(range(2, 20)), turn_options(r2, max_gen=2))
    assert drive(engine)[-1].usage[2] == 0
