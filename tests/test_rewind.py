"""Request rewind (docs/onnxruntime-genai-0.18-dynamic-engine.md, "Rewind (`rewind_to_start_of_turn`)"):
a TurnComplete request goes back to where an earlier turn began -- tokens, committed KV and blocks --
and later turns run as if the rewound turns never happened."""
import pytest

import oga as og
import oga.testing as ogt
from helpers import OracleSequence, counters, drive, expected_turn_events, key, turn_options


def run_turn(engine, request, prompt, max_gen):
    request.begin_turn(prompt, turn_options(request, max_gen=max_gen))
    return drive(engine)


def test_rewind_to_each_turn_start_replays_like_a_fresh_history():
    model = ogt.create_test_model(block_size=4)
    engine = og.Engine(model)
    r = engine.create_request()
    turns = [([5, 9, 13], 6), ([4, 7], 5), ([11], 7)]
    for prompt, max_gen in turns:
        run_turn(engine, r, prompt, max_gen)
    blocks_after_three = ogt.engine_counters(engine)["free_blocks"]
    # Back to where turn 2 began: turn 1 stays, turns 2 and 3 are gone.
    r.rewind_to_start_of_turn(2)
    ogt.check_invariants(engine)
    assert ogt.engine_counters(engine)["free_blocks"] > blocks_after_three  # turn 2 and 3's blocks came back
    oracle = OracleSequence()
    oracle.turn(*turns[0])
    evs = run_turn(engine, r, [20, 21], 6)
    toks, reason = oracle.turn([20, 21], max_gen=6)
    assert [key(e) for e in evs] == expected_turn_events(4, 2, toks, reason)  # ids stay monotonic
    # Turn 3 was discarded with turn 2; turn 1 is still a target, and turn 4 is the newest.
    with pytest.raises(RuntimeError, match=r"^Cannot rewind to unknown Turn ID 3\.$"):
        r.rewind_to_start_of_turn(3)
    r.rewind_to_start_of_turn(1)  # back to the empty sequence
    ogt.check_invariants(engine)
    evs = run_turn(engine, r, [5, 9, 13], 6)
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=6)
    assert [key(e) for e in evs] == expected_turn_events(5, 3, toks, reason)


def test_rewind_gives_the_cache_back_and_the_next_turn_prefills_the_history():
    # As 0.18 (tests/conformance: rewind_frees_blocks_for_a_peer, rewind_releases_residency_*): a rewind
    # releases the request's blocks and residency slot, even where turn 2 began in the middle of a
    # block; the next turn is admitted like a first turn and prefills the retained history again.
    model = ogt.create_test_model(block_size=4)
    engine = og.Engine(model)
    r = engine.create_request()
    run_turn(engine, r, [5, 9, 13], 2)   # 5 tokens: 2 blocks, processed 4
    run_turn(engine, r, [7, 8, 9, 10, 11], 9)
    r.rewind_to_start_of_turn(2)
    ogt.check_invariants(engine)
    c = ogt.engine_counters(engine)
    assert c["free_blocks"] == c["total_blocks"]
    assert c["resident_requests"] == 0 and c["waiting_requests"] == 0
    assert not engine.has_pending_requests()
    oracle = OracleSequence()
    oracle.turn([5, 9, 13], max_gen=2)
    r.begin_turn([30], turn_options(r, max_gen=8))
    assert ogt.engine_counters(engine)["waiting_requests"] == 1
    evs = drive(engine)
    toks, reason = oracle.turn([30], max_gen=8)
    assert [key(e) for e in evs] == expected_turn_events(3, 1, toks, reason)
    ogt.check_invariants(engine)


def test_rewind_after_cancelled_turns():
    engine = og.Engine(ogt.create_test_model())
    # A first turn cancelled before admission: nothing resident, rewind to it empties the request.
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=4))
    assert r.cancel_turn(1)
    drive(engine)
    r.rewind_to_start_of_turn(1)
    evs = run_turn(engine, r, [6, 7], 3)
    toks, reason = OracleSequence().turn([6, 7], max_gen=3)
    assert [key(e) for e in evs] == expected_turn_events(2, 2, toks, reason)
    # A turn cancelled mid-generation.
    r2 = engine.create_request()
    run_turn(engine, r2, [5, 9, 13], 3)
    tid = r2.begin_turn([4], turn_options(r2, max_gen=20))
    buffer = engine.create_event_buffer(4)
    engine.run(buffer)
    engine.run(buffer)
    assert r2.cancel_turn(tid)
    drive(engine)
    r2.rewind_to_start_of_turn(tid)
    ogt.check_invariants(engine)
    oracle = OracleSequence()
    oracle.turn([5, 9, 13], max_gen=3)
    evs = run_turn(engine, r2, [4], 5)
    toks, reason = oracle.turn([4], max_gen=5)
    assert [key(e) for e in evs] == expected_turn_events(tid + 1, 1, toks, reason)


def test_rewind_preconditions_and_messages():
    model = ogt.create_test_model()
    engine = og.Engine(model)
    r = engine.create_request()
    with pytest.raises(RuntimeError, match=r"^Request rewind is only valid after the current turn is complete\.$"):
        r.rewind_to_start_of_turn(1)  # Unassigned
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=4))
    with pytest.raises(RuntimeError, match=r"^Request rewind is only valid after the current turn is complete\.$"):
        r.rewind_to_start_of_turn(1)  # Assigned
    buffer = engine.create_event_buffer(1)
    engine.run(buffer)
    engine.run(buffer)
    with pytest.raises(RuntimeError, match=r"^Request rewind is only valid after the current turn is complete\.$"):
        r.rewind_to_start_of_turn(1)  # Active
    big = engine.create_event_buffer(64)
    drive(engine, big)
    r.rewind_to_start_of_turn(1)
    # A retained (undelivered) event of the request blocks its rewind.
    r2 = engine.create_request()
    r2.begin_turn([5, 9, 13], turn_options(r2, max_gen=1))
    r3 = engine.create_request()
    r3.begin_turn([6, 9, 13], turn_options(r3, max_gen=1))
    tiny = engine.create_event_buffer(1)
    engine.run(tiny)  # one step: both turns finish, one event is retained
    pending_request = r3 if tiny[0].request is r2 else r2
    with pytest.raises(RuntimeError, match=r"^Cannot rewind a request while an Engine event is pending; call "
                                           r"Engine::Run\(\) to drain the event before rewinding\.$"):
        pending_request.rewind_to_start_of_turn(1)
    drive(engine, big)
    for turn_id in (0, 2, 99):
        with pytest.raises(RuntimeError, match=rf"^Cannot rewind to unknown Turn ID {turn_id}\.$"):
            r2.rewind_to_start_of_turn(turn_id)
    r2.rewind_to_start_of_turn(1)
    assert not engine.has_pending_requests()
    r2.close()
    with pytest.raises(RuntimeError, match=r"^Cannot rewind a closed request\.$"):
        r2.rewind_to_start_of_turn(1)
    ogt.check_invariants(engine)


def test_rewind_of_a_failed_turn_is_refused():
    model = ogt.create_test_model(max_block_table_columns=2, block_size=4)
    engine = og.Engine(model)
    r = engine.create_request()
    r.begin_turn(list(range(2, 14)), turn_options(r, max_gen=2))  # 12 tokens need 3 columns
    evs = drive(engine)
    assert evs[-1].finish_reason == 6
    with pytest.raises(RuntimeError, match=r"^Cannot rewind a Request whose current turn failed\.$"):
        r.rewind_to_start_of_turn(1)


def test_rewind_does_not_change_turn_id_or_finish_reason_and_creates_no_event():
    engine = og.Engine(ogt.create_test_model())
    r = engine.create_request()
    run_turn(engine, r, [5, 9, 13], 3)
    before = counters(engine)["retained_events"]
    r.rewind_to_start_of_turn(1)
    assert counters(engine)["retained_events"] == before == 0
    assert not engine.has_pending_requests()
    assert r.begin_turn([5], turn_options(r, max_gen=1)) == 2
