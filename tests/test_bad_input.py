"""Every entry point rejects bad input before changing anything: None / wrong types, bad shapes,
token ids outside the vocabulary, out-of-range counts, closed requests, stale turn ids, turn-id
exhaustion, another engine's buffer, session caps."""

import numpy as np
import pytest

import oga as og
import oga.testing as ogt
from helpers import (
    OracleSequence, counters, drive, expected_turn_events, key, make_engine, turn_options,
)

ONE_DIM = "tokens must be a one-dimensional array."
EXHAUSTED = "The request cannot admit another turn because its uint64 turn id space is exhausted."
UINT64_MAX = 2 ** 64 - 1


def _unchanged(engine, before):
    assert counters(engine) == before
    assert not engine.has_pending_requests()
    ogt.check_invariants(engine)


def _works(engine, r, turn_id=1, prompt=(5, 9, 13)):
    assert r.begin_turn(list(prompt), turn_options(r, max_gen=2)) == turn_id
    events = drive(engine)
    toks, reason = OracleSequence().turn(list(prompt), max_gen=2)
    assert [key(e) for e in events] == expected_turn_events(turn_id, len(prompt), toks, reason)


@pytest.mark.parametrize("arg", [None, "model", 3, object()])
def test_engine_requires_a_model(arg):
    with pytest.raises(TypeError):
        og.Engine(arg)


def test_create_request_argument_types(engine):
    with pytest.raises(TypeError):
        engine.create_request(options="x")
    with pytest.raises(TypeError):
        engine.create_request(options=3)
    with pytest.raises(TypeError):
        engine.create_request("params")
    assert counters(engine)["bound_requests"] == 0


def test_event_buffer_capacity_checks(engine):
    with pytest.raises((OverflowError, TypeError)):
        engine.create_event_buffer(-1)
    with pytest.raises((OverflowError, TypeError)):
        engine.create_event_buffer(2 ** 64)
    with pytest.raises(TypeError):
        engine.create_event_buffer("3")
    with pytest.raises(TypeError):
        engine.create_event_buffer(None)
    with pytest.raises(RuntimeError) as info:
        engine.create_event_buffer(2 ** 63)
    assert str(info.value) == "Engine event capacity exceeds the supported size."


@pytest.mark.parametrize("tokens", [None, object(), 3.5j])
def test_begin_turn_rejects_non_sequences(engine, tokens):
    r = engine.create_request()
    before = counters(engine)
    with pytest.raises((TypeError, ValueError)):
        r.begin_turn(tokens)
    _unchanged(engine, before)
    _works(engine, r)


def test_begin_turn_none_is_type_error(engine):
    r = engine.create_request()
    with pytest.raises(TypeError):
        r.begin_turn(None)


@pytest.mark.parametrize("tokens", [[[5, 9], [13, 2]], np.zeros((2, 2), dtype=np.int32), 5, np.int32(5),
                                    np.zeros((1, 3), dtype=np.int64)])
def test_begin_turn_rejects_other_dimensions(engine, tokens):
    r = engine.create_request()
    before = counters(engine)
    with pytest.raises(ValueError) as info:
        r.begin_turn(tokens)
    assert str(info.value) == ONE_DIM
    _unchanged(engine, before)
    _works(engine, r)


@pytest.mark.parametrize("tokens", [[2 ** 31], [5, 2 ** 40], [-(2 ** 31) - 1], [2 ** 64], [-(2 ** 70)],
                                    np.array([5, 2 ** 33], dtype=np.int64), np.array([2 ** 63], dtype=np.uint64)])
def test_begin_turn_rejects_values_outside_int32_without_wrapping(engine, tokens):
    r = engine.create_request()
    before = counters(engine)
    with pytest.raises((ValueError, OverflowError)):
        r.begin_turn(tokens)
    _unchanged(engine, before)
    _works(engine, r)


@pytest.mark.parametrize("tokens", [[64], [5, 9, 64], [-1], [5, -7], [2 ** 31 - 1], [-(2 ** 31)]])
def test_token_ids_outside_the_vocabulary_fail_at_begin_turn(engine, tokens):
    r = engine.create_request()
    before = counters(engine)
    with pytest.raises(RuntimeError):
        r.begin_turn(tokens)
    _unchanged(engine, before)
    _works(engine, r)  # no turn id consumed; engine healthy


def test_out_of_vocabulary_continuation_changes_nothing(engine):
    r = engine.create_request()
    oracle = OracleSequence()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=2))
    drive(engine)
    oracle.turn([5, 9, 13], max_gen=2)
    before = counters(engine)
    with pytest.raises(RuntimeError):
        r.begin_turn([4, 100], turn_options(r, max_gen=2))
    _unchanged(engine, before)
    assert r.begin_turn([4], turn_options(r, max_gen=2)) == 2
    events = drive(engine)
    toks, reason = oracle.turn([4], max_gen=2)
    assert [key(e) for e in events] == expected_turn_events(2, 1, toks, reason)


def test_begin_turn_accepts_array_likes(engine):
    variants = [
        [5, 9, 13],
        (5, 9, 13),
        np.array([5, 9, 13], dtype=np.int64),
        np.array([5, 9, 13], dtype=np.int32),
        np.array([13, 0, 9, 0, 5], dtype=np.int32)[::-2],  # negative stride
        np.array([5, 7, 9, 7, 13], dtype=np.int32)[::2],  # positive stride
        range(5, 14, 4),
    ]
    ro = np.array([5, 9, 13], dtype=np.int32)
    ro.flags.writeable = False
    variants.append(ro)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=2)
    for v in variants:
        r = engine.create_request()
        assert r.begin_turn(v, turn_options(r, max_gen=2)) == 1
        events = drive(engine)
        assert [key(e) for e in events] == expected_turn_events(1, 3, toks, reason), repr(v)
        r.close()


def test_begin_turn_copies_tokens(engine):
    arr = np.array([5, 9, 13], dtype=np.int32)
    r = engine.create_request()
    r.begin_turn(arr, turn_options(r, max_gen=2))
    arr[:] = 7
    events = drive(engine)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=2)
    assert [key(e) for e in events] == expected_turn_events(1, 3, toks, reason)


def test_empty_tokens(engine):
    r = engine.create_request()
    before = counters(engine)
    for empty in ([], np.array([], dtype=np.int32)):
        with pytest.raises(RuntimeError) as info:
            r.begin_turn(empty)
        assert str(info.value) == "Expected at least one input token for generation. Received 0."
    _unchanged(engine, before)
    _works(engine, r)


def test_turn_options_argument_types(engine):
    r = engine.create_request()
    with pytest.raises(TypeError):
        og.TurnOptions(None)
    with pytest.raises(TypeError):
        og.TurnOptions("request")
    with pytest.raises(TypeError):
        r.begin_turn([5, 9, 13], "options")
    with pytest.raises(TypeError):
        r.begin_turn([5, 9, 13], og.RequestOptions())
    t = og.TurnOptions(r)
    with pytest.raises((TypeError, OverflowError)):
        t.set_max_generated_tokens(-1)
    with pytest.raises(TypeError):
        t.set_max_generated_tokens("3")
    with pytest.raises((TypeError, OverflowError)):
        t.set_min_generated_tokens(2 ** 64)
    with pytest.raises(ValueError) as info:
        t.set_stop_strings(["a\0b"])
    assert str(info.value) == "Stop strings must not contain an embedded NUL byte."
    assert not engine.has_pending_requests()
    _works(engine, r)


def test_request_options_range(engine):
    opts = og.RequestOptions()
    with pytest.raises((OverflowError, TypeError)):
        opts.set_max_session_tokens(-1)
    with pytest.raises((OverflowError, TypeError)):
        opts.set_max_session_tokens(2 ** 64)
    with pytest.raises(TypeError):
        opts.set_max_session_tokens("9")
    for bad in (129, 1000, UINT64_MAX):
        opts.set_max_session_tokens(bad)  # stored, validated at request creation
        with pytest.raises(RuntimeError) as info:
            engine.create_request(options=opts)
        assert str(info.value) == (f"max_session_tokens ({bad}) must be greater than zero and no greater than the "
                                   f"Engine's max_request_length (128).")
    assert counters(engine)["bound_requests"] == 0
    opts.set_max_session_tokens(128)
    engine.create_request(options=opts)
    opts.set_max_session_tokens(0)  # 0 = default
    _works(engine, engine.create_request(options=opts))


def test_closed_request_everywhere(engine, buffer):
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=2))
    t = og.TurnOptions(r)
    r.close()
    with pytest.raises(RuntimeError) as info:
        r.begin_turn([5])
    assert str(info.value) == "Cannot use a closed request."
    with pytest.raises(RuntimeError) as info:
        og.TurnOptions(r)
    assert str(info.value) == "Cannot use a closed request."
    with pytest.raises(RuntimeError) as info:
        t.set_max_generated_tokens(4)
    assert str(info.value) == "Cannot use a closed request."
    with pytest.raises(RuntimeError) as info:
        r.cancel_turn(1)
    assert str(info.value) == "Cannot cancel after the request's engine has been destroyed."
    r.close()
    assert not engine.has_pending_requests()
    assert len(engine.run(buffer)) == 0


def test_cancel_argument_checks(engine):
    r = engine.create_request()
    with pytest.raises(RuntimeError) as info:
        r.cancel_turn(1)
    assert str(info.value) == "Cannot cancel a request before a turn has begun."
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=2))
    with pytest.raises((OverflowError, TypeError)):
        r.cancel_turn(-1)
    with pytest.raises((OverflowError, TypeError)):
        r.cancel_turn(2 ** 64)
    with pytest.raises(TypeError):
        r.cancel_turn("1")
    for stale in (0, 2, 7, UINT64_MAX):
        assert r.cancel_turn(stale) is False
    events = drive(engine)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=2)
    assert [key(e) for e in events] == expected_turn_events(1, 3, toks, reason)


def test_turn_id_exhaustion(engine):
    r = engine.create_request()
    ogt.set_last_turn_id(r, UINT64_MAX)
    before = counters(engine)
    with pytest.raises(RuntimeError) as info:
        r.begin_turn([5, 9, 13])
    assert str(info.value) == EXHAUSTED
    _unchanged(engine, before)


def test_last_turn_id_is_usable_once(engine):
    r = engine.create_request()
    ogt.set_last_turn_id(r, UINT64_MAX - 1)
    assert r.begin_turn([5, 9, 13], turn_options(r, max_gen=2)) == UINT64_MAX
    events = drive(engine)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=2)
    assert [key(e) for e in events] == expected_turn_events(UINT64_MAX, 3, toks, reason)
    assert r.cancel_turn(UINT64_MAX) is False
    before = counters(engine)
    with pytest.raises(RuntimeError) as info:
        r.begin_turn([4])
    assert str(info.value) == EXHAUSTED
    _unchanged(engine, before)


def test_set_last_turn_id_requires_an_idle_request(engine):
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=2))
    with pytest.raises(RuntimeError):
        ogt.set_last_turn_id(r, 10)
    drive(engine)


def test_another_engines_buffer():
    _, e1 = make_engine()
    _, e2 = make_engine()
    r = e2.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    b1 = e1.create_event_buffer(4)
    for _ in range(2):
        with pytest.raises(RuntimeError) as info:
            e2.run(b1)
        assert str(info.value) == "buffer must be used with the Engine that created it."
    assert counters(e2)["model_runs"] == 0
    assert e2.has_pending_requests()
    drive(e2)


def test_request_of_another_engine_with_options_of_another_request():
    _, e1 = make_engine()
    _, e2 = make_engine()
    r1, r2 = e1.create_request(), e2.create_request()
    t2 = og.TurnOptions(r2)
    with pytest.raises(RuntimeError):
        r1.begin_turn([5, 9, 13], t2)
    assert not e1.has_pending_requests() and not e2.has_pending_requests()
    _works(e1, r1)


def test_huge_prompt_beyond_context(engine):
    r = engine.create_request()
    before = counters(engine)
    with pytest.raises(RuntimeError) as info:
        r.begin_turn([3] * 1000)
    assert str(info.value).startswith("Appending input_tokens_count (1000) to current_sequence_length (0)")
    _unchanged(engine, before)
