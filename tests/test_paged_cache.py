"""Paged KV-cache ownership: block growth, whole-prompt reservation at admission, release on close,
unserviceable failure and abandonment, reuse of released blocks, and the invariant checker."""

import gc

import pytest

import oga.testing as ogt
from helpers import (
    OracleSequence, counters, drive, expected_turn_events, key, make_engine, per_request, prompt_without_eos,
    run_once, turn_options,
)


def ceil_div(a, b):
    return -(-a // b)


def test_fresh_engine_counters_and_invariants():
    _, engine = make_engine(num_blocks=37)
    ogt.check_invariants(engine)
    c = counters(engine)
    assert c["total_blocks"] == 37 and c["free_blocks"] == 37
    for k in ("model_runs", "committed_steps", "rolled_back_steps", "resident_requests", "waiting_requests",
              "bound_requests", "retained_events"):
        assert c[k] == 0, k


@pytest.mark.parametrize("block_size", [1, 2, 4, 8])
def test_blocks_grow_with_committed_length(block_size):
    _, engine = make_engine(block_size=block_size)
    prompt = prompt_without_eos(10)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=10))
    buf = engine.create_event_buffer(4)
    total = counters(engine)["total_blocks"]
    step = 0
    while engine.has_pending_requests():
        run_once(engine, buf)
        step += 1
        processed = 3 + (step - 1)
        c = counters(engine)
        assert c["free_blocks"] == total - ceil_div(processed, block_size), f"step {step}"
        assert c["resident_requests"] == 1
    assert step == 10
    # Turn-complete residents keep their blocks; close releases them immediately.
    assert counters(engine)["free_blocks"] == total - ceil_div(12, block_size)
    r.close()
    assert counters(engine)["free_blocks"] == total
    assert counters(engine)["resident_requests"] == 0
    ogt.check_invariants(engine)


def test_admission_reserves_the_whole_prompt():
    _, engine = make_engine(chunk_size=2)
    prompt = prompt_without_eos(6, length=9)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=6))
    buf = engine.create_event_buffer(4)
    for i in range(4):
        assert run_once(engine, buf) == []
        assert counters(engine)["free_blocks"] == 128 - 3, f"chunk {i}: the whole 9-token prompt stays reserved"
    evs = run_once(engine, buf)  # last chunk (1 token) samples
    assert len(evs) == 1
    assert counters(engine)["free_blocks"] == 128 - 3  # 9 processed
    for processed in (10, 11, 12, 13, 14):
        run_once(engine, buf)
        assert counters(engine)["free_blocks"] == 128 - ceil_div(processed, 4)


def test_admission_waits_until_the_whole_prompt_fits():
    # 5 blocks; a resident holds 3; a 9-token prompt needs 3 > 2 free even though its first chunk fits.
    _, engine = make_engine(num_blocks=5, chunk_size=2, preemption="none")
    holder = engine.create_request()
    holder.begin_turn(list(range(10, 20)), turn_options(holder, max_gen=1))  # 10 tokens -> 3 blocks
    drive(engine)
    assert counters(engine)["free_blocks"] == 2
    r = engine.create_request()
    prompt = list(range(30, 39))
    r.begin_turn(prompt, turn_options(r, max_gen=1))
    buf = engine.create_event_buffer(4)
    evs = run_once(engine, buf)
    assert [(e.flags, e.request, e.error_code) for e in evs] == [(4, None, 1)]
    assert counters(engine)["free_blocks"] == 2
    holder.close()
    events = drive(engine, buf)
    toks, reason = OracleSequence(max_session=21).turn(prompt, max_gen=1)
    assert [key(e) for e in events] == expected_turn_events(1, 9, toks, reason)


@pytest.mark.parametrize("state", ["queued", "mid_prefill", "decoding", "turn_complete", "cancelled"])
def test_close_releases_blocks_immediately(state):
    _, engine = make_engine(chunk_size=2)
    buf = engine.create_event_buffer(4)
    r = engine.create_request()
    prompt = prompt_without_eos(8, length=9)
    r.begin_turn(prompt, turn_options(r, max_gen=8))
    if state == "mid_prefill":
        run_once(engine, buf)
        assert counters(engine)["free_blocks"] == 125
    elif state == "decoding":
        for _ in range(7):
            run_once(engine, buf)
        assert counters(engine)["free_blocks"] == 125
    elif state == "turn_complete":
        drive(engine, buf)
        assert counters(engine)["free_blocks"] == 128 - 4
    elif state == "cancelled":
        run_once(engine, buf)
        run_once(engine, buf)
        assert r.cancel_turn(1)
    peer = engine.create_request()
    peer.begin_turn([5, 9, 13], turn_options(peer, max_gen=3))
    r.close()
    ogt.check_invariants(engine)
    c = counters(engine)
    assert c["free_blocks"] == 128
    assert c["bound_requests"] == 1
    events = drive(engine, buf)
    assert all(e.request is peer for e in events)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=3)
    assert [key(e) for e in events] == expected_turn_events(1, 3, toks, reason)


def test_abandonment_is_reclaimed_at_the_next_boundary_not_before():
    _, engine = make_engine()
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=6))
    buf = engine.create_event_buffer(4)
    zero = engine.create_event_buffer(0)
    run_once(engine, buf)
    run_once(engine, buf)
    assert counters(engine)["free_blocks"] == 127
    del r
    gc.collect()
    c = counters(engine)
    assert c["bound_requests"] == 1 and c["free_blocks"] == 127, "release only publishes abandonment"
    engine.run(zero)  # capacity 0 is not a reclamation boundary
    c = counters(engine)
    assert c["bound_requests"] == 1 and c["free_blocks"] == 127
    assert not engine.has_pending_requests()  # a boundary: reclaims, and the work is gone
    c = counters(engine)
    assert c["bound_requests"] == 0 and c["free_blocks"] == 128 and c["resident_requests"] == 0
    ogt.check_invariants(engine)
    assert counters(engine)["model_runs"] == 2


@pytest.mark.parametrize("boundary", ["run", "create_request", "begin_turn", "has_pending_requests"])
def test_every_owner_boundary_reclaims(boundary):
    _, engine = make_engine()
    other = engine.create_request()
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    drive(engine)
    assert counters(engine)["free_blocks"] == 127
    del r
    gc.collect()
    assert counters(engine)["free_blocks"] == 127
    if boundary == "run":
        engine.run(engine.create_event_buffer(1))
    elif boundary == "create_request":
        engine.create_request()
    elif boundary == "begin_turn":
        other.begin_turn([4])
    else:
        engine.has_pending_requests()
    assert counters(engine)["free_blocks"] == 128
    ogt.check_invariants(engine)


def test_abandonment_purges_retained_events_of_that_request_only():
    _, engine = make_engine()
    prompts = ([5, 9, 13], [7, 7], [20, 21, 22, 23])
    reqs = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=1))
        reqs.append(r)
    one = engine.create_event_buffer(1)
    first = engine.run(one)
    assert first[0].request is reqs[0]
    assert counters(engine)["retained_events"] == 2
    del reqs[1]
    gc.collect()
    evs = run_once(engine, one)  # boundary: reclaims and purges the abandoned request's event
    assert len(evs) == 1 and evs[0].request is reqs[1]
    toks, reason = OracleSequence().turn(prompts[2], max_gen=1)
    assert [key(e) for e in evs] == expected_turn_events(1, 4, toks, reason)
    assert counters(engine)["retained_events"] == 0
    assert not engine.has_pending_requests()
    assert counters(engine)["free_blocks"] == 128 - 2


def test_released_blocks_are_reused_correctly():
    # A 4-block pool serves many requests one after another; stale slot contents must never leak.
    _, engine = make_engine(num_blocks=4)
    for i in range(12):
        prompt = [(i * 5 + j) % 60 + 2 for j in range(6 + i % 5)]
        r = engine.create_request()
        r.begin_turn(prompt, turn_options(r, max_gen=5))
        events = drive(engine)
        toks, reason = OracleSequence(max_session=17).turn(prompt, max_gen=5)
        assert [key(e) for e in events] == expected_turn_events(1, len(prompt), toks, reason)
        r.close()
        assert counters(engine)["free_blocks"] == 4


def test_concurrent_requests_fill_the_pool_exactly():
    # 6 blocks of 4 slots; three requests each end with 8 processed tokens (2 blocks).
    _, engine = make_engine(num_blocks=6)
    prompts = [prompt_without_eos(6, offset=i) for i in range(3)]
    reqs = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=6))
        reqs.append(r)
    events = drive(engine)
    got = per_request(events)
    for r, p in zip(reqs, prompts):
        toks, reason = OracleSequence(max_session=25).turn(p, max_gen=6)
        assert got[r] == expected_turn_events(1, 3, toks, reason)
    assert counters(engine)["free_blocks"] == 0
    for r in reqs:
        r.close()
    assert counters(engine)["free_blocks"] == 6


def test_num_blocks_one_limits_request_length():
    _, engine = make_engine(num_blocks=1)
    assert engine.get_capabilities().max_request_length == 5
    prompt = prompt_without_eos(2)
    r = engine.create_request()
    r.begin_turn(prompt)
    events = drive(engine)
    toks, reason = OracleSequence(max_session=5).turn(prompt)
    assert [key(e) for e in events] == expected_turn_events(1, 3, toks, reason)
    assert counters(engine)["free_blocks"] == 0
