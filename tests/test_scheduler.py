"""Dynamic scheduler: decode-first stable order, max_batch_size (rows and residency),
max_scheduled_tokens (default 2048 and overrides), chunk_size, skip-and-continue, CapacityDeferred,
unserviceable requests."""

import pytest

import oga.testing as ogt
from helpers import (
    CAPACITY_BLOCKED, E_DEFERRED, E_UNSERVICEABLE, FAILED, R_FAILED, TOKEN, TURN_FINISHED, OracleSequence,
    counters, drive, expected_turn_events, key, make_engine, per_request, prompt_without_eos, run_once,
    turn_options,
)


def inputs(engine):
    d = ogt.last_step_inputs(engine)
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in d.items()}


def rows_of(engine):
    """(input_ids per row, past lengths) of the last executed step."""
    d = inputs(engine)
    cum = d["cumulative_sequence_lengths"]
    ids = d["input_ids"]
    return [ids[cum[i]:cum[i + 1]] for i in range(d["num_rows"])], d["past_sequence_lengths"]


def test_decode_first_then_resident_prefill_then_new_prefill():
    _, engine = make_engine(max_scheduled_tokens=5)
    caps = engine.get_capabilities()
    assert caps.max_scheduled_tokens == 5
    P = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    D = [40, 41]
    N = [30, 31, 32]
    oP, oD, oN = OracleSequence(), OracleSequence(), OracleSequence()
    tP, _ = oP.turn(P, stop_after=2)
    tD, rD = oD.turn(D, max_gen=3)
    tN, _ = oN.turn(N, stop_after=1)
    assert len(tD) == 3 and len(tP) == 2 and len(tN) == 1, "pick prompts without early EOS"
    p = engine.create_request()
    p.begin_turn(P, turn_options(p, max_gen=2))
    d = engine.create_request()
    d.begin_turn(D, turn_options(d, max_gen=3))
    buf = engine.create_event_buffer(16)

    # Step 1: both new; one provisional token each, the remaining budget (3) expands P.
    assert run_once(engine, buf) == []
    rows, past = rows_of(engine)
    assert rows == [P[0:4], D[0:1]] and past == [0, 0]
    # Step 2: both resident prefills, same rule; D finishes its prompt and samples.
    evs = run_once(engine, buf)
    rows, past = rows_of(engine)
    assert rows == [P[4:8], D[1:2]] and past == [4, 1]
    assert [(e.request, e.token) for e in evs] == [(d, tD[0])]
    # A new request arrives: decode first, then the resident prefill, then the new prefill.
    n = engine.create_request()
    n.begin_turn(N, turn_options(n, max_gen=1))
    evs = run_once(engine, buf)
    rows, past = rows_of(engine)
    assert rows == [[tD[0]], P[8:10], N[0:2]]
    assert past == [2, 8, 0]
    assert [(e.request, e.token) for e in evs] == [(d, tD[1]), (p, tP[0])]
    # Step 4: decodes in resident order (P was admitted before D), then N's last prompt token.
    evs = run_once(engine, buf)
    rows, past = rows_of(engine)
    assert rows == [[tP[0]], [tD[1]], N[2:3]]
    assert past == [10, 3, 2]
    assert [(e.request, e.token, e.flags) for e in evs] == [
        (p, tP[1], TOKEN | TURN_FINISHED), (d, tD[2], TOKEN | TURN_FINISHED), (n, tN[0], TOKEN | TURN_FINISHED)]
    assert not engine.has_pending_requests()


def test_max_batch_size_bounds_rows_and_residency():
    # 0.18's behaviour (no preemption): turn-complete residents keep their residency slots.
    _, engine = make_engine(max_batch_size=2, preemption="none")
    prompts = [prompt_without_eos(3, length=2, offset=i) for i in range(3)]
    reqs = [engine.create_request() for _ in prompts]
    for r, p in zip(reqs, prompts):
        r.begin_turn(p, turn_options(r, max_gen=3))
    buf = engine.create_event_buffer(16)
    all_events = []
    for i in range(3):
        evs = run_once(engine, buf)
        assert [e.request for e in evs] == reqs[:2], "no capacity event while some work fits"
        assert inputs(engine)["num_rows"] == 2
        all_events += evs
    c = counters(engine)
    assert c["resident_requests"] == 2 and c["waiting_requests"] == 1
    # Both residents are turn-complete but still occupy residency: the third cannot be admitted.
    runs = c["model_runs"]
    for _ in range(2):
        evs = run_once(engine, buf)
        assert [(e.flags, e.request, e.error_code) for e in evs] == [(CAPACITY_BLOCKED, None, E_DEFERRED)]
        assert counters(engine)["model_runs"] == runs
        assert engine.has_pending_requests()
    reqs[0].close()
    evs = drive(engine, buf)
    all_events += evs
    assert inputs(engine)["num_rows"] == 1
    got = per_request(all_events)
    for r, p in zip(reqs, prompts):
        toks, reason = OracleSequence().turn(p, max_gen=3)
        assert got[r] == expected_turn_events(1, 2, toks, reason)


def _long_prompt(n, seed):
    return [((i * 7 + seed * 13) % 61) + 2 for i in range(n)]


def test_default_token_budget_is_2048():
    cfg = dict(context_length=4096, num_blocks=1100)
    _, engine = make_engine(**cfg)
    assert engine.get_capabilities().max_scheduled_tokens == 2048
    assert engine.get_capabilities().max_request_length == 4096
    A, B = _long_prompt(1500, 1), _long_prompt(1500, 2)
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn(A, turn_options(a, max_gen=2))
    b.begin_turn(B, turn_options(b, max_gen=1))
    buf = engine.create_event_buffer(8)
    evs = run_once(engine, buf)
    d = inputs(engine)
    assert d["num_tokens"] == 2048 and d["cumulative_sequence_lengths"] == [0, 1500, 2048]
    assert [e.request for e in evs] == [a]
    evs += run_once(engine, buf)
    d = inputs(engine)
    assert d["num_tokens"] == 953 and d["cumulative_sequence_lengths"] == [0, 1, 953]
    assert d["past_sequence_lengths"] == [1500, 548]
    got = per_request(evs)
    ta, ra = OracleSequence(max_session=4096).turn(A, max_gen=2)
    tb, rb = OracleSequence(max_session=4096).turn(B, max_gen=1)
    assert got[a] == expected_turn_events(1, 1500, ta, ra)
    assert got[b] == expected_turn_events(1, 1500, tb, rb)


def test_single_long_prompt_chunks_by_the_default_budget():
    _, engine = make_engine(context_length=4096, num_blocks=1100)
    prompt = _long_prompt(3000, 3)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=1))
    buf = engine.create_event_buffer(8)
    assert run_once(engine, buf) == []
    assert inputs(engine)["num_tokens"] == 2048
    evs = run_once(engine, buf)
    assert inputs(engine)["num_tokens"] == 952
    toks, reason = OracleSequence(max_session=4096).turn(prompt, max_gen=1)
    assert [key(e) for e in evs] == expected_turn_events(1, 3000, toks, reason)


@pytest.mark.parametrize("budget", [1, 3, 7])
def test_budget_override_bounds_every_step(budget):
    _, engine = make_engine(max_scheduled_tokens=budget)
    assert engine.get_capabilities().max_scheduled_tokens == budget
    prompts = [[5, 9, 13, 2, 3], [7, 7], [20, 21, 22, 23, 24, 25, 26], [4]]
    reqs = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=4))
        reqs.append(r)
    buf = engine.create_event_buffer(16)
    events = []
    seen_full = False
    while engine.has_pending_requests():
        events += run_once(engine, buf)
        d = inputs(engine)
        assert 1 <= d["num_tokens"] <= budget
        assert d["num_rows"] <= budget
        seen_full |= d["num_tokens"] == budget
    assert seen_full
    got = per_request(events)
    for r, p in zip(reqs, prompts):
        toks, reason = OracleSequence().turn(p, max_gen=4)
        assert got[r] == expected_turn_events(1, len(p), toks, reason)


def test_decode_demand_can_starve_prefill():
    _, engine = make_engine(max_scheduled_tokens=2)
    prompts = [prompt_without_eos(4, length=1, offset=i) for i in range(3)]
    reqs = [engine.create_request() for _ in prompts]
    for r, p in zip(reqs, prompts):
        r.begin_turn(p, turn_options(r, max_gen=4))
    buf = engine.create_event_buffer(8)
    for i in range(4):
        evs = run_once(engine, buf)
        assert [e.request for e in evs] == reqs[:2]
        d = inputs(engine)
        assert d["num_rows"] == 2
        assert d["graph_eligible"] == (i > 0)
    evs = run_once(engine, buf)
    assert [e.request for e in evs] == [reqs[2]]
    drive(engine, buf)


def test_chunk_size_bounds_prefill_contributions():
    _, engine = make_engine(chunk_size=3)
    A = [10, 11, 12, 13, 14, 15, 16, 17]
    B = [40, 41]
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn(A, turn_options(a, max_gen=2))
    b.begin_turn(B, turn_options(b, max_gen=3))
    buf = engine.create_event_buffer(8)
    ta, ra = OracleSequence().turn(A, max_gen=2)
    tb, rb = OracleSequence().turn(B, max_gen=3)
    assert len(tb) == 3
    events = run_once(engine, buf)
    rows, past = rows_of(engine)
    assert rows == [A[0:3], B] and past == [0, 0]
    events += run_once(engine, buf)
    rows, past = rows_of(engine)
    assert rows == [[tb[0]], A[3:6]] and past == [2, 3]
    events += run_once(engine, buf)
    rows, past = rows_of(engine)
    assert rows == [[tb[1]], A[6:8]] and past == [3, 6]
    events += drive(engine, buf)
    got = per_request(events)
    assert got[a] == expected_turn_events(1, 8, ta, ra)
    assert got[b] == expected_turn_events(1, 2, tb, rb)


def test_blocked_candidate_does_not_hide_later_fitting_one():
    # 4 blocks of 4 slots; without preemption the resident keeps its blocks while turn-complete.
    _, engine = make_engine(num_blocks=4, preemption="none")
    assert engine.get_capabilities().max_request_length == 17
    a = engine.create_request()
    A = [10, 11, 12, 13, 14]
    a.begin_turn(A, turn_options(a, max_gen=1))
    drive(engine)
    assert counters(engine)["free_blocks"] == 2
    B = list(range(20, 32))  # 12 tokens: 3 blocks, does not fit now
    C = [40, 41]  # 1 block, fits
    b, c = engine.create_request(), engine.create_request()
    b.begin_turn(B, turn_options(b, max_gen=1))
    c.begin_turn(C, turn_options(c, max_gen=1))
    buf = engine.create_event_buffer(8)
    evs = run_once(engine, buf)
    assert [e.request for e in evs] == [c]
    rows, _ = rows_of(engine)
    assert rows == [C]
    tc, rc = OracleSequence().turn(C, max_gen=1)
    assert [key(e) for e in evs] == expected_turn_events(1, 2, tc, rc)
    assert counters(engine)["free_blocks"] == 1
    runs = counters(engine)["model_runs"]
    evs = run_once(engine, buf)
    assert [(e.flags, e.request, e.turn_id, e.token, e.error_code, e.usage) for e in evs] == [
        (CAPACITY_BLOCKED, None, 0, None, E_DEFERRED, (0, 0, 0))]
    assert counters(engine)["model_runs"] == runs
    assert counters(engine)["waiting_requests"] == 1
    a.close()
    assert counters(engine)["free_blocks"] == 3
    evs = run_once(engine, buf)
    rows, _ = rows_of(engine)
    assert rows == [B]
    tb, rb = OracleSequence(max_session=17).turn(B, max_gen=1)
    assert [key(e) for e in evs] == expected_turn_events(1, 12, tb, rb)
    assert [e.request for e in evs] == [b]


def test_unserviceable_prompt_fails_that_turn_only():
    _, engine = make_engine(max_block_table_columns=2)
    assert engine.get_capabilities().max_request_length == 128
    U = list(range(10, 19))  # 9 tokens -> 3 block-table columns > 2
    F = [5, 9, 13]
    u, f = engine.create_request(), engine.create_request()
    u.begin_turn(U, turn_options(u, max_gen=2))
    f.begin_turn(F, turn_options(f, max_gen=2))
    buf = engine.create_event_buffer(8)
    evs = run_once(engine, buf)
    assert [(e.request, e.flags, e.turn_id, e.token, e.finish_reason, e.error_code, e.usage) for e in evs] == [
        (u, TURN_FINISHED | FAILED, 1, None, R_FAILED, E_UNSERVICEABLE, (9, 0, 0))]
    assert counters(engine)["model_runs"] == 0, "nothing else runs in the call that reports it"
    events = drive(engine, buf)
    tf, rf = OracleSequence().turn(F, max_gen=2)
    assert [key(e) for e in events] == expected_turn_events(1, 3, tf, rf)
    assert all(e.request is f for e in events)
    with pytest.raises(RuntimeError) as info:
        u.begin_turn([3])
    assert str(info.value) in ("Cannot continue a Request whose current turn failed.",
                               "Cannot continue a request whose model state is no longer resident.")
    c = counters(engine)
    assert c["free_blocks"] == c["total_blocks"] - 1  # only f's block (4 tokens processed)
    assert not engine.has_pending_requests()


def test_unserviceable_growth_of_a_resident():
    _, engine = make_engine(max_block_table_columns=2)
    prompt = prompt_without_eos(7)
    r = engine.create_request()
    r.begin_turn(prompt)
    peer = engine.create_request()
    peer.begin_turn([4], turn_options(peer, max_gen=2))
    events = drive(engine)
    got = per_request(events)
    toks, _ = OracleSequence().turn(prompt, stop_after=6)
    expected = [(TOKEN, 1, t, 0, 0, (0, 0, 0)) for t in toks]
    expected.append((TURN_FINISHED | FAILED, 1, None, R_FAILED, E_UNSERVICEABLE, (3, 6, 0)))
    assert got[r] == expected
    tp, rp = OracleSequence().turn([4], max_gen=2)
    assert got[peer] == expected_turn_events(1, 1, tp, rp)
    c = counters(engine)
    assert c["free_blocks"] == c["total_blocks"] - 1  # the failed request's blocks were released
    with pytest.raises(RuntimeError):
        r.begin_turn([3])
    assert not engine.has_pending_requests()
