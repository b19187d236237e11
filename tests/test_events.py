"""Engine.run: drain-or-execute, buffer capacity, retained overflow, views and their staleness."""

import pytest

import oga as og
import oga.testing as ogt
from helpers import (
    E_NONE, TOKEN, TURN_FINISHED, OracleSequence, counters, drive,
    expected_turn_events, key, make_engine, per_request, run_once, turn_options,
)

STALE = ("This EngineEvent view is stale: its EngineEventBuffer was run again. "
         "Copy event values out before the next Engine.run.")

PROMPTS = [[5, 9, 13], [7, 7], [20, 21, 22, 23]]


def _three_requests(engine, max_gen=2):
    reqs = []
    for p in PROMPTS:
        r = engine.create_request()
        assert r.begin_turn(p, turn_options(r, max_gen=max_gen)) == 1
        reqs.append(r)
    return reqs


def _expected(max_gen=2):
    out = []
    for p in PROMPTS:
        toks, reason = OracleSequence().turn(p, max_gen=max_gen)
        out.append(expected_turn_events(1, len(p), toks, reason))
    return out


def test_run_returns_the_same_buffer(engine):
    b = engine.create_event_buffer(4)
    assert engine.run(b) is b
    assert len(b) == 0
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    assert engine.run(b) is b
    assert len(b) == 1


def test_idle_run_returns_no_events_and_executes_nothing(engine, buffer):
    assert not engine.has_pending_requests()
    assert len(run_once(engine, buffer)) == 0
    assert counters(engine)["model_runs"] == 0
    engine.create_request()  # Unassigned: no work
    assert not engine.has_pending_requests()
    assert len(run_once(engine, buffer)) == 0
    assert counters(engine)["model_runs"] == 0


def test_capacity_zero_is_a_no_op(engine):
    zero = engine.create_event_buffer(0)
    reqs = _three_requests(engine)
    for _ in range(3):
        assert engine.run(zero) is zero
        assert len(zero) == 0
    c = counters(engine)
    assert c["model_runs"] == 0 and c["committed_steps"] == 0
    assert c["waiting_requests"] == 3
    assert engine.has_pending_requests()
    ogt.check_invariants(engine)
    # The work is still all there.
    events = drive(engine)
    got = per_request(events)
    assert [got[r] for r in reqs] == _expected()


def test_capacity_one_executes_once_then_drains_in_request_order(engine):
    reqs = _three_requests(engine, max_gen=1)
    one = engine.create_event_buffer(1)
    seen = []
    for i in range(3):
        evs = run_once(engine, one)
        assert len(evs) == 1
        seen.append(evs[0])
        assert counters(engine)["model_runs"] == 1, "later calls must drain without running the model"
        assert counters(engine)["retained_events"] == 2 - i
    assert [e.request for e in seen] == reqs
    assert [key(e) for e in seen] == [x[0] for x in _expected(max_gen=1)]
    assert not engine.has_pending_requests()


@pytest.mark.parametrize("capacity", [3, 64])
def test_bulk_capacity_returns_the_whole_step(engine, capacity):
    reqs = _three_requests(engine, max_gen=1)
    b = engine.create_event_buffer(capacity)
    evs = run_once(engine, b)
    assert [e.request for e in evs] == reqs
    assert [key(e) for e in evs] == [x[0] for x in _expected(max_gen=1)]
    assert counters(engine)["model_runs"] == 1
    assert counters(engine)["retained_events"] == 0
    assert not engine.has_pending_requests()


@pytest.mark.parametrize("capacity", [1, 3, 64])
def test_streams_do_not_depend_on_capacity(capacity):
    _, engine = make_engine()
    reqs = _three_requests(engine, max_gen=6)
    events = drive(engine, capacity=capacity)
    got = per_request(events)
    assert [got[r] for r in reqs] == _expected(max_gen=6)
    # Within each step the events follow request order; with a single prefill step all three
    # requests stay in lock step, so the global order is the round-robin of the three streams.
    assert [e.request for e in events] == reqs * 6


def test_retained_overflow_is_drained_without_executing_even_with_spare_capacity(engine):
    reqs = _three_requests(engine, max_gen=4)
    one = engine.create_event_buffer(1)
    big = engine.create_event_buffer(64)
    first = run_once(engine, one)
    assert len(first) == 1 and counters(engine)["model_runs"] == 1
    rest = run_once(engine, big)
    assert [e.request for e in rest] == reqs[1:]
    assert counters(engine)["model_runs"] == 1, "draining must not run the model"
    assert counters(engine)["retained_events"] == 0
    nxt = run_once(engine, big)
    assert counters(engine)["model_runs"] == 2
    assert [e.request for e in nxt] == reqs


def test_partial_prefill_returns_no_events_while_pending():
    _, engine = make_engine(max_scheduled_tokens=2)
    r = engine.create_request()
    prompt = [3, 4, 5, 6, 7, 8]
    r.begin_turn(prompt, turn_options(r, max_gen=1))
    b = engine.create_event_buffer(8)
    assert len(run_once(engine, b)) == 0
    assert engine.has_pending_requests()
    assert len(run_once(engine, b)) == 0
    assert engine.has_pending_requests()
    assert counters(engine)["model_runs"] == 2 and counters(engine)["committed_steps"] == 2
    evs = run_once(engine, b)
    toks, reason = OracleSequence().turn(prompt, max_gen=1)
    assert [key(e) for e in evs] == expected_turn_events(1, 6, toks, reason)
    assert not engine.has_pending_requests()


def test_seed_form_run_max_events_returns_list(engine):
    reqs = _three_requests(engine, max_gen=1)
    evs = engine.run(max_events=1)
    assert isinstance(evs, list) and len(evs) == 1 and evs[0].request is reqs[0]
    evs = engine.run(max_events=8)
    assert isinstance(evs, list) and [e.request for e in evs] == reqs[1:]
    assert counters(engine)["model_runs"] == 1
    assert engine.run(max_events=8) == []


def test_run_argument_forms_are_exclusive(engine, buffer):
    with pytest.raises(TypeError):
        engine.run()
    with pytest.raises(TypeError):
        engine.run(buffer, max_events=3)
    with pytest.raises(TypeError):
        engine.run(object())
    with pytest.raises(TypeError):
        engine.run(None)


def test_sequence_protocol_negative_index_and_index_error(engine):
    reqs = _three_requests(engine, max_gen=1)
    b = engine.create_event_buffer(8)
    engine.run(b)
    assert len(b) == 3
    assert b[-1].request is reqs[2]
    assert b[-3].request is reqs[0]
    assert [e.request for e in b] == reqs
    with pytest.raises(IndexError):
        b[3]
    with pytest.raises(IndexError):
        b[-4]
    with pytest.raises(IndexError):
        b[2 ** 70]


def test_stale_view_raises(engine):
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=3))
    b = engine.create_event_buffer(4)
    engine.run(b)
    ev = b[0]
    usage = ev.usage
    assert ev.flags == og.EngineEventFlags.TOKEN
    engine.run(b)
    for getter in (lambda: ev.flags, lambda: ev.token, lambda: ev.request, lambda: ev.turn_id,
                   lambda: ev.finish_reason, lambda: ev.error_code, lambda: ev.usage,
                   lambda: ev.matched_stop_string_index, lambda: usage.prompt_tokens,
                   lambda: usage.generated_tokens, lambda: usage.cached_prompt_tokens):
        with pytest.raises(RuntimeError) as info:
            getter()
        assert str(info.value) == STALE
    # A fresh view of the new contents works.
    assert b[0].flags == og.EngineEventFlags.TOKEN


def test_stale_view_also_after_an_empty_validated_run(engine):
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    b = engine.create_event_buffer(4)
    engine.run(b)
    ev = b[0]
    engine.run(b)  # idle, validated: count 0, previous views invalid
    assert len(b) == 0
    with pytest.raises(RuntimeError, match="stale"):
        ev.token


def test_views_survive_deleting_the_buffer_variable(engine):
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    b = engine.create_event_buffer(4)
    ev = engine.run(b)[0]
    del b
    toks, _ = OracleSequence().turn([5, 9, 13], max_gen=1)
    assert ev.token == toks[0] and ev.request is r


def test_failed_run_validation_leaves_buffer_untouched():
    _, e1 = make_engine()
    _, e2 = make_engine()
    r = e1.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=2))
    b = e1.create_event_buffer(4)
    e1.run(b)
    ev = b[0]
    token = ev.token
    with pytest.raises(RuntimeError) as info:
        e2.run(b)
    assert str(info.value) == "buffer must be used with the Engine that created it."
    assert len(b) == 1 and ev.token == token  # previous views stay valid
    assert counters(e2)["model_runs"] == 0


def test_buffer_bound_to_its_engine_even_at_capacity_zero():
    _, e1 = make_engine()
    _, e2 = make_engine()
    b = e1.create_event_buffer(0)
    with pytest.raises(RuntimeError) as info:
        e2.run(b)
    assert str(info.value) == "buffer must be used with the Engine that created it."


def test_token_is_none_without_token_flag_and_usage_zero_on_token_events():
    # Find a prompt that ends with EOS after one visible token so both event kinds appear.
    from helpers import R_EOS, find_prompt

    prompt = find_prompt(lambda p: OracleSequence().turn(p)[1] == R_EOS and len(OracleSequence().turn(p)[0]) == 1,
                         length=2)
    _, engine = make_engine()
    r = engine.create_request()
    r.begin_turn(prompt)
    b = engine.create_event_buffer(8)
    e1 = run_once(engine, b)
    assert len(e1) == 1 and e1[0].flags == TOKEN and e1[0].usage == (0, 0, 0)
    assert e1[0].finish_reason == 0 and e1[0].error_code == E_NONE
    e2 = run_once(engine, b)
    assert len(e2) == 1 and e2[0].flags == TURN_FINISHED
    assert e2[0].token is None
    assert e2[0].usage == (2, 1, 0)
    assert e2[0].turn_id == 1


def test_capacity_blocked_event_fields():
    # Residency full of turn-complete requests: without preemption the third cannot be admitted.
    _, engine = make_engine(max_batch_size=2, preemption="none")
    a, b_ = engine.create_request(), engine.create_request()
    for r in (a, b_):
        r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    drive(engine)
    c = engine.create_request()
    c.begin_turn([4, 4], turn_options(c, max_gen=1))
    buf = engine.create_event_buffer(4)
    runs_before = counters(engine)["model_runs"]
    ev = engine.run(buf)[0]
    assert ev.flags == og.EngineEventFlags.CAPACITY_BLOCKED
    assert ev.request is None and ev.turn_id == 0 and ev.token is None
    assert ev.error_code == og.EngineErrorCode.CAPACITY_DEFERRED
    assert ev.finish_reason == og.FinishReason.NONE
    u = ev.usage
    assert (u.prompt_tokens, u.generated_tokens, u.cached_prompt_tokens) == (0, 0, 0)
    assert len(buf) == 1
    assert counters(engine)["model_runs"] == runs_before
    assert engine.has_pending_requests()
    ogt.check_invariants(engine)
    a.close()
    evs = drive(engine)
    toks, reason = OracleSequence().turn([4, 4], max_gen=1)
    assert [key(e) for e in evs] == expected_turn_events(1, 2, toks, reason)
    assert all(e.request is c for e in evs)


def test_event_turn_ids_across_turns(engine):
    r = engine.create_request()
    oracle = OracleSequence()
    for tid, p in enumerate(([5, 9, 13], [2, 3], [40]), start=1):
        assert r.begin_turn(p, turn_options(r, max_gen=3)) == tid
        evs = drive(engine, capacity=2)
        toks, reason = oracle.turn(p, max_gen=3)
        assert [key(e) for e in evs] == expected_turn_events(tid, len(p), toks, reason)
        assert all(e.turn_id == tid for e in evs)
