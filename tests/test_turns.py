"""Turns: ids, per-turn and session limits, usage, finish reasons, continuation, min_generated_tokens,
and the turn options / features that are rejected until they land."""

import pytest

import oga as og
import oga.testing as ogt
from helpers import (
    R_EOS, R_MAX_GEN, R_MAX_SESSION, OracleSequence, counters, drive, expected_turn_events, find_prompt, key,
    make_engine, per_request, prompt_without_eos, turn_options,
)



def _session_msg(count, length, cap):
    return (f"Appending input_tokens_count ({count}) to current_sequence_length ({length}) must leave room for at "
            f"least one generated token before max_session_tokens ({cap}).")


def test_turn_ids_limits_usage_across_three_turns(engine):
    r = engine.create_request()
    oracle = OracleSequence()
    for tid, (prompt, max_gen) in enumerate((([5, 9, 13], 4), ([2, 3], 2), ([40, 41, 42, 43, 44], 6)), start=1):
        assert r.begin_turn(prompt, turn_options(r, max_gen=max_gen)) == tid
        evs = drive(engine)
        toks, reason = oracle.turn(prompt, max_gen=max_gen)
        assert [key(e) for e in evs] == expected_turn_events(tid, len(prompt), toks, reason)
    assert not engine.has_pending_requests()


def test_turn_limit_reason_and_usage(engine):
    prompt = prompt_without_eos(5)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=5))
    evs = drive(engine)
    assert len(evs) == 5
    last = evs[-1]
    assert last.flags == og.EngineEventFlags.TOKEN | og.EngineEventFlags.TURN_FINISHED
    assert last.finish_reason == R_MAX_GEN and last.usage == (3, 5, 0)
    assert all(e.usage == (0, 0, 0) and e.finish_reason == 0 for e in evs[:-1])


def test_unset_turn_limit_runs_to_the_session_cap():
    # Small vocabulary-free check: with max_generated_tokens 0 (unset) the default session cap applies.
    prompt = find_prompt(lambda p: OracleSequence(max_session=16).turn(p)[1] == R_MAX_SESSION, length=3)
    _, engine = make_engine(context_length=16)
    r = engine.create_request()
    t = og.TurnOptions(r)
    t.set_max_generated_tokens(0)
    r.begin_turn(prompt, t)
    evs = drive(engine)
    toks, reason = OracleSequence(max_session=16).turn(prompt)
    assert reason == R_MAX_SESSION and len(toks) == 13
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)


def test_explicit_session_cap_and_continuation_room(engine):
    prompt = prompt_without_eos(3, length=4)
    opts = og.RequestOptions()
    opts.set_max_session_tokens(10)
    r = engine.create_request(options=opts)
    oracle = OracleSequence(max_session=10)
    r.begin_turn(prompt, turn_options(r, max_gen=3))
    drive(engine)
    oracle.turn(prompt, max_gen=3)
    assert len(oracle.tokens) == 7
    with pytest.raises(RuntimeError) as info:
        r.begin_turn([4, 5, 6])
    assert str(info.value) == _session_msg(3, 7, 10)
    assert not engine.has_pending_requests()
    assert r.begin_turn([4, 5]) == 2  # the failed call consumed no turn id
    evs = drive(engine)
    toks, reason = oracle.turn([4, 5])
    assert [key(e) for e in evs] == expected_turn_events(2, 2, toks, reason)
    if reason == R_MAX_SESSION:
        assert len(toks) == 1


def test_first_turn_must_leave_room_for_one_token(engine):
    opts = og.RequestOptions()
    opts.set_max_session_tokens(10)
    r = engine.create_request(options=opts)
    with pytest.raises(RuntimeError) as info:
        r.begin_turn(list(range(2, 12)))
    assert str(info.value) == _session_msg(10, 0, 10)
    with pytest.raises(RuntimeError) as info:
        engine.create_request().begin_turn([3] * 128)
    assert str(info.value) == _session_msg(128, 0, 128)
    assert r.begin_turn(list(range(2, 11))) == 1
    evs = drive(engine)
    toks, reason = OracleSequence(max_session=10).turn(list(range(2, 11)))
    assert [key(e) for e in evs] == expected_turn_events(1, 9, toks, reason)


def test_session_cap_larger_than_max_length_is_honoured():
    prompt = find_prompt(lambda p: OracleSequence(max_session=30).turn(p)[1] == R_MAX_SESSION, length=3)
    _, engine = make_engine(max_length=20)
    opts = og.RequestOptions()
    opts.set_max_session_tokens(30)
    r = engine.create_request(options=opts)
    r.begin_turn(prompt)
    evs = drive(engine)
    toks, reason = OracleSequence(max_session=30).turn(prompt)
    assert len(toks) == 27
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)
    # Unset -> search.max_length.
    r2 = engine.create_request()
    p2 = find_prompt(lambda p: OracleSequence(max_session=20).turn(p)[1] == R_MAX_SESSION, length=3)
    r2.begin_turn(p2)
    evs = drive(engine)
    toks, reason = OracleSequence(max_session=20).turn(p2)
    assert len(toks) == 17
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)


def test_turn_limit_wins_over_session_limit_on_the_same_token(engine):
    prompt = prompt_without_eos(4)
    opts = og.RequestOptions()
    opts.set_max_session_tokens(7)
    r = engine.create_request(options=opts)
    r.begin_turn(prompt, turn_options(r, max_gen=4))
    evs = drive(engine)
    assert evs[-1].finish_reason == R_MAX_GEN
    assert evs[-1].usage == (3, 4, 0)


def test_eos_finishes_without_emitting_or_appending():
    prompt = find_prompt(lambda p: (lambda t: t[1] == R_EOS and len(t[0]) >= 2)(OracleSequence().turn(p)), length=2)
    _, engine = make_engine()
    r = engine.create_request()
    r.begin_turn(prompt)
    evs = drive(engine)
    oracle = OracleSequence()
    toks, reason = oracle.turn(prompt)
    assert reason == R_EOS
    assert [key(e) for e in evs] == expected_turn_events(1, 2, toks, reason)
    assert 1 not in [e.token for e in evs]
    # The EOS was not appended: the continuation sees prompt + visible tokens only.
    r.begin_turn([9], turn_options(r, max_gen=3))
    evs = drive(engine)
    toks, reason = oracle.turn([9], max_gen=3)
    assert [key(e) for e in evs] == expected_turn_events(2, 1, toks, reason)


def test_min_generated_tokens_masks_eos():
    prompt = find_prompt(_first_is_eos, length=2)
    _, engine = make_engine()
    r = engine.create_request()
    r.begin_turn(prompt)
    evs = drive(engine)
    assert [key(e) for e in evs] == expected_turn_events(1, 2, [], R_EOS)
    r2 = engine.create_request()
    r2.begin_turn(prompt, turn_options(r2, min_gen=3, max_gen=10))
    evs = drive(engine)
    toks, reason = OracleSequence().turn(prompt, max_gen=10, min_gen=3)
    assert len(toks) >= 3 and not set(toks[:3]) & {1}
    assert [key(e) for e in evs] == expected_turn_events(1, 2, toks, reason)


def _first_is_eos(p):
    s = OracleSequence()
    s.extend(p)
    return s.greedy() == 1


def test_multiple_eos_ids_and_small_vocabulary():
    cfg = dict(vocab_size=8, eos_token_id=[1, 5])
    _, engine = make_engine(**cfg)
    prompts = [[2, 3], [4], [6, 7, 2], [3, 3, 3, 3], [7], [2, 2]]
    reqs = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=12))
        reqs.append(r)
    got = per_request(drive(engine))
    reasons = []
    for r, p in zip(reqs, prompts):
        toks, reason = OracleSequence(vocab=8, eos=(1, 5)).turn(p, max_gen=12)
        reasons.append(reason)
        assert got[r] == expected_turn_events(1, len(p), toks, reason)
        assert not {1, 5} & set(toks)
    assert R_EOS in reasons  # the configuration really exercises EOS


def test_min_generated_exceeding_max_is_rejected(engine):
    r = engine.create_request()
    with pytest.raises(RuntimeError) as info:
        r.begin_turn([5, 9, 13], turn_options(r, max_gen=2, min_gen=3))
    assert str(info.value) == "min_generated_tokens (3) must not exceed max_generated_tokens (2)."
    assert not engine.has_pending_requests()
    assert r.begin_turn([5, 9, 13], turn_options(r, max_gen=3, min_gen=3)) == 1
    evs = drive(engine)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=3, min_gen=3)
    assert reason == R_MAX_GEN
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)


def test_min_generated_must_fit_the_session(engine):
    opts = og.RequestOptions()
    opts.set_max_session_tokens(10)
    r = engine.create_request(options=opts)
    prompt = [5, 9, 13, 2, 3]
    with pytest.raises(RuntimeError) as info:
        r.begin_turn(prompt, turn_options(r, min_gen=6))
    assert str(info.value).startswith("min_generated_tokens (6) does not fit between the turn's prompt length")
    assert not engine.has_pending_requests()
    assert r.begin_turn(prompt, turn_options(r, min_gen=5)) == 1
    evs = drive(engine)
    toks, reason = OracleSequence(max_session=10).turn(prompt, min_gen=5)
    assert (len(toks), reason) == (5, R_MAX_SESSION)
    assert [key(e) for e in evs] == expected_turn_events(1, 5, toks, reason)


# Stop strings and guidance decode tokens: on a model with no token text (a test model without
# oga.testing.set_token_table) the turn is refused with a clear error and nothing changes.
TEXT_SETTERS = {
    "stop_strings": lambda t: t.set_stop_strings(["xy"]),
    "guidance": lambda t: t.set_guidance("regex", "a+"),
}


@pytest.mark.parametrize("name", sorted(TEXT_SETTERS))
def test_text_turn_options_need_the_models_token_text(engine, name):
    r = engine.create_request()
    t = turn_options(r, max_gen=2)
    TEXT_SETTERS[name](t)  # storing the value succeeds
    with pytest.raises(RuntimeError) as info:
        r.begin_turn([5, 9, 13], t)
    assert "need the model's tokenizer" in str(info.value)
    assert "OgaExtModelSetTokenTable" in str(info.value)
    assert not engine.has_pending_requests()
    assert counters(engine)["waiting_requests"] == 0
    t.reset()
    t.set_max_generated_tokens(2)
    assert r.begin_turn([5, 9, 13], t) == 1  # no turn id consumed
    evs = drive(engine)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=2)
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)


def test_cleared_seed_and_guidance_are_accepted(engine):
    r = engine.create_request()
    t = turn_options(r, max_gen=1)
    t.set_seed(3)
    t.clear_seed()
    t.set_guidance("regex", "a+")
    t.clear_guidance()
    assert r.begin_turn([5, 9, 13], t) == 1
    drive(engine)


def test_draft_tokens_are_rejected(engine, buffer):
    assert engine.max_draft_tokens_per_proposal() == 0
    prompt = prompt_without_eos(4)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=4))
    engine.run(buffer)  # decode-ready now
    for tokens in ([5], [5, 6, 7]):
        with pytest.raises(RuntimeError) as info:
            r.set_draft_tokens(tokens)
        assert str(info.value) == "This engine does not support speculative draft verification."
    evs = drive(engine)
    toks, reason = OracleSequence().turn(prompt, max_gen=4)
    assert [key(e) for e in evs] == expected_turn_events(1, 3, toks, reason)[1:]
