"""Request states: creation, BeginTurn preconditions, CancelTurn, Close (purge + release), options
snapshots, engine destruction."""

import gc

import pytest

import oga as og
import oga.testing as ogt
from helpers import (
    E_NONE, R_CANCELLED, R_MAX_GEN, TOKEN, TURN_FINISHED, OracleSequence, counters, drive,
    expected_turn_events, key, make_engine, per_request, prompt_without_eos, run_once, turn_options,
)

ONLY_AFTER_COMPLETE = "BeginTurn is only valid for a new request or after the current turn is complete."
PENDING = ("Cannot continue a request while an Engine event is pending; call Engine::Run() to drain the event "
           "before continuing.")
CLOSED = "Cannot use a closed request."
CANCEL_BEFORE = "Cannot cancel a request before a turn has begun."
CANCEL_CLOSED = "Cannot cancel after the request's engine has been destroyed."


def _raises(exc, text, fn, *args):
    with pytest.raises(exc) as info:
        fn(*args)
    assert str(info.value) == text
    return info


def test_new_request_is_unassigned(engine):
    r = engine.create_request()
    assert not engine.has_pending_requests()
    c = counters(engine)
    assert c["bound_requests"] == 1 and c["waiting_requests"] == 0 and c["resident_requests"] == 0
    assert c["free_blocks"] == c["total_blocks"] == 128
    _raises(RuntimeError, CANCEL_BEFORE, r.cancel_turn, 1)
    _raises(RuntimeError, CANCEL_BEFORE, r.cancel_turn, 0)
    ogt.check_invariants(engine)


def test_begin_turn_queues_and_returns_turn_id(engine):
    r = engine.create_request()
    assert r.begin_turn([5, 9, 13]) == 1
    assert engine.has_pending_requests()
    c = counters(engine)
    assert c["waiting_requests"] == 1 and c["resident_requests"] == 0
    assert c["free_blocks"] == 128  # nothing allocated before the first step
    ogt.check_invariants(engine)


def test_begin_turn_rejected_while_assigned_and_while_active(engine, buffer):
    prompt = prompt_without_eos(5)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=5))
    _raises(RuntimeError, ONLY_AFTER_COMPLETE, r.begin_turn, [4])  # Assigned
    run_once(engine, buffer)
    _raises(RuntimeError, ONLY_AFTER_COMPLETE, r.begin_turn, [4])  # Active
    events = drive(engine)
    toks, reason = OracleSequence().turn(prompt, max_gen=5)
    got = [key(e) for e in events]
    assert got == expected_turn_events(1, 3, toks, reason)[1:]


def test_begin_turn_rejected_while_terminal_event_pending(engine):
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn([5, 9, 13], turn_options(a, max_gen=1))
    b.begin_turn([7, 7], turn_options(b, max_gen=1))
    one = engine.create_event_buffer(1)
    evs = run_once(engine, one)
    assert evs[0].request is a
    del evs
    # b's terminal event is still retained.
    _raises(RuntimeError, PENDING, b.begin_turn, [3])
    assert a.begin_turn([3], turn_options(a, max_gen=1)) == 2  # a's own event was drained
    evs = run_once(engine, one)
    assert evs[0].request is b and evs[0].flags == TOKEN | TURN_FINISHED
    assert b.begin_turn([3], turn_options(b, max_gen=1)) == 2
    drive(engine)


def test_cancel_queued_turn_then_continue(engine, buffer):
    r = engine.create_request()
    tid = r.begin_turn([5, 9, 13])
    assert r.cancel_turn(tid) is True
    assert r.cancel_turn(tid) is False
    assert engine.has_pending_requests()  # the cancel event is pending
    _raises(RuntimeError, PENDING, r.begin_turn, [2])
    evs = run_once(engine, buffer)
    assert [key(e) for e in evs] == [(TURN_FINISHED, 1, None, R_CANCELLED, E_NONE, (3, 0, 0))]
    assert evs[0].request is r
    assert counters(engine)["model_runs"] == 0
    assert not engine.has_pending_requests()
    # A first turn cancelled before admission can continue: both fragments prefill together.
    assert r.begin_turn([2, 3], turn_options(r, max_gen=4)) == 2
    events = drive(engine)
    oracle = OracleSequence()
    oracle.extend([5, 9, 13])
    toks, reason = oracle.turn([2, 3], max_gen=4)
    assert [key(e) for e in events] == expected_turn_events(2, 2, toks, reason)


def test_cancel_active_turn_keeps_committed_tokens(engine, buffer):
    prompt = prompt_without_eos(12)
    r = engine.create_request()
    tid = r.begin_turn(prompt)
    got = []
    for _ in range(3):
        got += run_once(engine, buffer)
    assert [e.flags for e in got] == [TOKEN] * 3
    assert r.cancel_turn(tid) is True
    evs = run_once(engine, buffer)
    assert [key(e) for e in evs] == [(TURN_FINISHED, 1, None, R_CANCELLED, E_NONE, (3, 3, 0))]
    assert r.cancel_turn(tid) is False
    assert not engine.has_pending_requests()
    runs = counters(engine)["model_runs"]
    assert runs == 3
    # The continuation sees prompt + the 3 committed tokens.
    oracle = OracleSequence()
    first, _ = oracle.turn(prompt, stop_after=3)
    assert [e.token for e in got] == first
    assert r.begin_turn([8], turn_options(r, max_gen=3)) == 2
    events = drive(engine)
    toks, reason = oracle.turn([8], max_gen=3)
    assert [key(e) for e in events] == expected_turn_events(2, 1, toks, reason)


def test_cancel_completed_stale_unknown_ids(engine, buffer):
    r = engine.create_request()
    tid = r.begin_turn([5, 9, 13], turn_options(r, max_gen=2))
    drive(engine)
    assert r.cancel_turn(tid) is False  # completed
    assert r.cancel_turn(0) is False
    assert r.cancel_turn(2) is False  # future
    assert r.cancel_turn(2 ** 64 - 1) is False
    assert not engine.has_pending_requests()
    tid2 = r.begin_turn([4], turn_options(r, max_gen=2))
    assert tid2 == 2
    assert r.cancel_turn(1) is False  # stale
    assert r.cancel_turn(3) is False
    evs = drive(engine)
    assert evs[-1].finish_reason == R_MAX_GEN  # not cancelled


def test_close_is_idempotent_from_every_state():
    model, engine = make_engine()
    buffer = engine.create_event_buffer(16)
    unassigned = engine.create_request()
    queued = engine.create_request()
    active = engine.create_request()
    complete = engine.create_request()
    complete.begin_turn([5, 9], turn_options(complete, max_gen=1))
    drive(engine)
    active.begin_turn(prompt_without_eos(10), turn_options(active, max_gen=10))
    run_once(engine, buffer)
    queued.begin_turn([6, 6])
    for r in (unassigned, queued, active, complete):
        r.close()
        ogt.check_invariants(engine)
        r.close()
        ogt.check_invariants(engine)
        with pytest.raises(RuntimeError) as info:
            r.begin_turn([4])
        assert str(info.value) == CLOSED
        with pytest.raises(RuntimeError) as info:
            og.TurnOptions(r)
        assert str(info.value) == CLOSED
        with pytest.raises(RuntimeError) as info:
            r.cancel_turn(1)
        assert str(info.value) == CANCEL_CLOSED
    c = counters(engine)
    assert c["free_blocks"] == c["total_blocks"]
    assert c["bound_requests"] == 0 and c["resident_requests"] == 0 and c["waiting_requests"] == 0
    assert not engine.has_pending_requests()
    assert len(run_once(engine, buffer)) == 0


def test_close_purges_only_that_requests_undelivered_events(engine):
    reqs = []
    for p in ([5, 9, 13], [7, 7], [20, 21, 22, 23]):
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=1))
        reqs.append(r)
    one = engine.create_event_buffer(1)
    first = run_once(engine, one)
    assert first[0].request is reqs[0]
    assert counters(engine)["retained_events"] == 2
    reqs[1].close()
    assert counters(engine)["retained_events"] == 1
    ogt.check_invariants(engine)
    nxt = run_once(engine, one)
    assert len(nxt) == 1 and nxt[0].request is reqs[2]
    toks, reason = OracleSequence().turn([20, 21, 22, 23], max_gen=1)
    assert [key(e) for e in nxt] == expected_turn_events(1, 4, toks, reason)
    assert counters(engine)["model_runs"] == 1
    assert not engine.has_pending_requests()


def test_closing_an_active_request_stops_its_tokens_without_affecting_peer(engine, buffer):
    pa, pb = prompt_without_eos(8), prompt_without_eos(8, offset=1)
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn(pa, turn_options(a, max_gen=8))
    b.begin_turn(pb, turn_options(b, max_gen=8))
    evs = run_once(engine, buffer) + run_once(engine, buffer)
    a.close()
    evs += drive(engine)
    got = per_request(evs)
    ta, _ = OracleSequence().turn(pa, stop_after=2)
    assert [k[2] for k in got[a]] == ta
    tb, rb = OracleSequence().turn(pb, max_gen=8)
    assert got[b] == expected_turn_events(1, len(pb), tb, rb)


def test_request_options_are_snapshotted(engine):
    opts = og.RequestOptions()
    opts.set_max_session_tokens(6)
    r = engine.create_request(options=opts)
    opts.set_max_session_tokens(100)
    prompt = prompt_without_eos(3)
    r.begin_turn(prompt)
    evs = drive(engine)
    toks, reason = OracleSequence(max_session=6).turn(prompt)
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)
    # The same options object is reusable: a second request gets the new value.
    r2 = engine.create_request(options=opts)
    r2.begin_turn(prompt)
    evs = drive(engine)
    toks2, reason2 = OracleSequence(max_session=100).turn(prompt)
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks2, reason2)


def test_turn_options_are_snapshotted_at_begin_turn(engine):
    prompt = prompt_without_eos(5)
    r = engine.create_request()
    t = turn_options(r, max_gen=5)
    r.begin_turn(prompt, t)
    t.set_max_generated_tokens(2)
    evs = drive(engine)
    toks, reason = OracleSequence().turn(prompt, max_gen=5)
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)


def test_turn_options_belong_to_their_request(engine):
    a, b = engine.create_request(), engine.create_request()
    t = turn_options(a, max_gen=1)
    with pytest.raises(RuntimeError) as info:
        b.begin_turn([5, 9, 13], t)
    assert str(info.value) == "Turn options belong to a different or destroyed Request."
    assert not engine.has_pending_requests()
    assert b.begin_turn([5, 9, 13]) == 1  # nothing was consumed


def test_create_request_does_not_make_work_pending(engine):
    for _ in range(20):
        engine.create_request()
    assert not engine.has_pending_requests()
    assert counters(engine)["model_runs"] == 0


def test_eos_inside_continuation_input_is_ordinary_context(engine):
    prompt = prompt_without_eos(2)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=2))
    drive(engine)
    oracle = OracleSequence()
    oracle.turn(prompt, max_gen=2)
    cont = [1, 1, 7]  # EOS ids inside the input do not end the turn
    r.begin_turn(cont, turn_options(r, max_gen=3))
    evs = drive(engine)
    toks, reason = oracle.turn(cont, max_gen=3)
    assert [key(e) for e in evs] == expected_turn_events(2, 3, toks, reason)


def test_destroying_the_engine_variable_keeps_requests_safe():
    # Releasing the last reference to the engine destroys it; its requests become tombstones:
    # every use raises (nothing crashes, nothing generates) and close stays idempotent.
    _, engine = make_engine()
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    del engine
    gc.collect()
    with pytest.raises(RuntimeError, match="Cannot use a closed request"):
        r.begin_turn([1, 2], turn_options(r, max_gen=1))
    with pytest.raises(RuntimeError, match="Cannot cancel after the request's engine has been destroyed"):
        r.cancel_turn(1)
    with pytest.raises(RuntimeError, match="Cannot rewind a closed request"):
        r.rewind_to_start_of_turn(1)
    r.close()
    r.close()
    with pytest.raises(RuntimeError, match="Cannot use a closed request"):
        r.set_draft_tokens([3])


def test_cancel_merges_into_the_retained_token_event(engine):
    prompts = ([5, 9, 13], [7, 7], [20, 21, 22, 23])
    reqs = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=6))
        reqs.append(r)
    one = engine.create_event_buffer(1)
    assert run_once(engine, one)[0].request is reqs[0]
    assert counters(engine)["retained_events"] == 2
    assert reqs[1].cancel_turn(1) is True
    assert counters(engine)["retained_events"] == 2, "no extra event: merged into the retained token event"
    evs = run_once(engine, one)
    toks, _ = OracleSequence().turn(prompts[1], stop_after=1)
    assert evs[0].request is reqs[1]
    assert key(evs[0]) == (TOKEN | TURN_FINISHED, 1, toks[0], R_CANCELLED, E_NONE, (2, 1, 0))
    assert counters(engine)["model_runs"] == 1
    events = drive(engine, one)
    got = per_request(events)
    assert reqs[1] not in got
    for r, p in ((reqs[0], prompts[0]), (reqs[2], prompts[2])):
        t, reason = OracleSequence().turn(p, max_gen=6)
        expected = expected_turn_events(1, len(p), t, reason)
        assert got[r] == (expected[1:] if r is reqs[0] else expected)


def test_unset_turn_options_mean_model_defaults_not_the_previous_turn(engine):
    prompt = prompt_without_eos(2)
    opts = og.RequestOptions()
    opts.set_max_session_tokens(20)
    r = engine.create_request(options=opts)
    oracle = OracleSequence(max_session=20)
    t = turn_options(r, max_gen=2)
    r.begin_turn(prompt, t)
    evs = drive(engine)
    toks, reason = oracle.turn(prompt, max_gen=2)
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)
    t.reset()
    r.begin_turn([4], t)  # reset options: no per-turn cap
    evs = drive(engine)
    toks, reason = oracle.turn([4])
    assert [key(e) for e in evs] == expected_turn_events(2, 1, toks, reason)
    assert reason != R_MAX_GEN


def test_model_search_config_rejections_at_create_request():
    model = ogt.create_test_model(search={"num_beams": 4})
    engine = og.Engine(model)
    with pytest.raises(RuntimeError) as info:
        engine.create_request()
    assert "search.num_beams = 4" in str(info.value) and "overlay" in str(info.value)
    model = ogt.create_test_model(search={"min_length": 3})
    engine = og.Engine(model)
    with pytest.raises(RuntimeError) as info:
        engine.create_request()
    assert "search.min_length (3)" in str(info.value)
    assert counters(engine)["bound_requests"] == 0
    # search.batch_size != 1 is not rejected: each request derives its own one-row search.
    model = ogt.create_test_model(search={"batch_size": 4})
    engine = og.Engine(model)
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    drive(engine)


@pytest.mark.parametrize("cfg", [dict(eos_token_id=64), dict(eos_token_id=[1, 70]), dict(vocab_size=0)])
def test_invalid_vocabulary_configuration_is_rejected(cfg):
    with pytest.raises(RuntimeError):
        model = ogt.create_test_model(**cfg)
        engine = og.Engine(model)
        engine.create_request()
