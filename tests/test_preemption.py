"""Recompute preemption (engine.dynamic_batching.preemption): when nothing schedulable fits, the
engine releases the KV cache of the most recently admitted running request (then of turn-complete
residents) and prefills its committed tokens again later.

What is asserted: the shapes that deadlock without preemption (as in onnxruntime-genai 0.18) finish;
every event stream equals the greedy oracle's (no duplicate, missing or different token, usage of
the turn unchanged) or, for seeded sampling, the stream of the same request on a pool large enough
never to preempt; the invariants hold after every Run; the preemption counters count what happened.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import oga as og
import oga.testing as ogt
from helpers import (
    CAPACITY_BLOCKED,
    E_DEFERRED,
    TURN_FINISHED,
    Job,
    OracleSequence,
    Turn,
    counters,
    drive,
    expected_turn_events,
    expected_workload,
    key,
    make_engine,
    per_request,
    prompt_without_eos,
    run_once,
    run_workload,
    turn_options,
)


def _crowd(count=8, prompt_len=60, gen=60):
    """`count` requests of `prompt_len` distinct prompt tokens and exactly `gen` generated ones."""
    return [Job([Turn([2 + (i * 7 + k) % 62 for k in range(prompt_len)], max_gen=gen, min_gen=gen)])
            for i in range(count)]


CROWD_MODEL = dict(num_blocks=128, block_size=4, max_batch_size=8, context_length=256)


def test_without_preemption_admitted_requests_deadlock():
    # 0.18's behaviour, kept by "none": 8 requests admitted together each hold part of the 128 x 4
    # pool and each need more, so every Run reports CapacityBlocked and none ever finishes.
    model, engine = make_engine(preemption="none", **CROWD_MODEL)
    requests = []
    for job in _crowd():
        r = engine.create_request()
        r.begin_turn(job.turns[0].prompt, turn_options(r, job.turns[0].max_gen, job.turns[0].min_gen))
        requests.append(r)
    buf = engine.create_event_buffer(64)
    blocked = 0
    for _ in range(400):
        for e in run_once(engine, buf):
            assert not (e.flags & TURN_FINISHED)
            if e.request is None:
                assert (e.flags, e.error_code) == (CAPACITY_BLOCKED, E_DEFERRED)
                blocked += 1
    assert blocked > 300
    assert engine.has_pending_requests()
    assert counters(engine)["preemptions"] == 0


def test_recompute_preemption_finishes_the_deadlocking_crowd():
    jobs = _crowd()
    result = run_workload(dict(CROWD_MODEL, preemption="recompute"), jobs, stall_limit=4)
    assert result.per_job == expected_workload(jobs, CROWD_MODEL)
    assert result.engine_events == []  # no CapacityBlocked: preemption resolved every shortage
    assert result.counters["preemptions"] > 0
    # Every preempted request recomputed at least part of what its cache held; never more than
    # the tokens the whole crowd ever had in cache.
    assert 0 < result.counters["recomputed_tokens"] <= result.counters["preemptions"] * 120


def test_preemption_is_the_default():
    jobs = _crowd(count=4, prompt_len=30, gen=40)
    model = dict(num_blocks=40, block_size=4, max_batch_size=4, context_length=128)
    result = run_workload(model, jobs, stall_limit=4)  # no preemption key: recompute
    assert result.per_job == expected_workload(jobs, model)
    assert result.counters["preemptions"] > 0


def test_the_most_recently_admitted_running_request_is_preempted_first():
    # Three requests admitted in one step fill the pool; when their decodes need blocks the newest
    # gives its cache back first and the oldest never does.
    _, engine = make_engine(num_blocks=9, block_size=4, max_batch_size=4, context_length=64)
    prompts = [prompt_without_eos(20, length=8, offset=i) for i in range(3)]
    reqs = [engine.create_request() for _ in prompts]
    for r, p in zip(reqs, prompts):
        r.begin_turn(p, turn_options(r, max_gen=20, min_gen=20))
    buf = engine.create_event_buffer(64)
    events = run_once(engine, buf)  # admits all three: 2 blocks each, 3 left
    assert counters(engine)["resident_requests"] == 3
    first_preemption_waiting = None
    while engine.has_pending_requests():
        before = counters(engine)["preemptions"]
        got = run_once(engine, buf)
        events += got
        if counters(engine)["preemptions"] > before and first_preemption_waiting is None:
            first_preemption_waiting = counters(engine)["waiting_requests"]
            # The newest went back to the queue; the oldest stayed resident.
            assert counters(engine)["resident_requests"] == 2
    got = per_request(events)
    for r, p in zip(reqs, prompts):
        toks, reason = OracleSequence().turn(p, max_gen=20, min_gen=20)
        assert got[r] == expected_turn_events(1, len(p), toks, reason)
    assert first_preemption_waiting == 1


def test_turn_complete_residents_are_preempted_for_new_requests():
    # Two turn-complete requests left open fill residency (max_batch_size 2); without preemption a
    # third request waits forever (test_scheduler covers 0.18's CapacityBlocked). With it, an idle
    # resident gives its slot and blocks back, and its next turn prefills its history again.
    model, engine = make_engine(max_batch_size=2, num_blocks=16, block_size=4, context_length=64)
    prompts = [prompt_without_eos(4, length=3, offset=i) for i in range(3)]
    a, b = engine.create_request(), engine.create_request()
    for r, p in zip((a, b), prompts):
        r.begin_turn(p, turn_options(r, max_gen=4))
    first = per_request(drive(engine))
    c = engine.create_request()
    c.begin_turn(prompts[2], turn_options(c, max_gen=4))
    third = per_request(drive(engine, stall_limit=2))
    assert counters(engine)["preemptions"] >= 1
    for r, p in ((a, prompts[0]), (b, prompts[1])):
        assert first[r] == expected_turn_events(1, 3, *OracleSequence(max_session=64).turn(p, max_gen=4))
    assert third[c] == expected_turn_events(1, 3, *OracleSequence(max_session=64).turn(prompts[2], max_gen=4))
    # The preempted one (a: admitted first, no turn running) continues from its whole history.
    second_prompt = [7, 8, 9]
    for r, p in ((a, prompts[0]), (b, prompts[1])):
        r.begin_turn(second_prompt, turn_options(r, max_gen=5))
    cont = per_request(drive(engine, stall_limit=2))
    for r, p in ((a, prompts[0]), (b, prompts[1])):
        seq = OracleSequence(max_session=64)
        seq.turn(p, max_gen=4)
        assert cont[r] == expected_turn_events(2, 3, *seq.turn(second_prompt, max_gen=5))


SHAPE = st.fixed_dictionaries({
    "block_size": st.sampled_from([1, 2, 4, 8]),
    "num_blocks": st.integers(4, 40),
    "max_batch_size": st.integers(1, 6),
    "max_scheduled_tokens": st.sampled_from([None, 4, 16, 64]),
    "prefix_caching": st.booleans(),
    "jobs": st.lists(st.tuples(st.integers(1, 24), st.integers(1, 24), st.integers(0, 12),
                               st.integers(0, 3)), min_size=1, max_size=8),
})


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(SHAPE)
def test_every_request_that_fits_alone_finishes(shape):
    # 300 random small pools and mixes (59 of 300 such shapes stall with preemption "none", 0.18's behaviour): every request
    # whose session fits the pool alone finishes, with the oracle's events.
    model = {k: shape[k] for k in ("block_size", "num_blocks", "max_batch_size", "max_scheduled_tokens",
                                   "prefix_caching")}
    model["context_length"] = 128
    capacity = min(128, model["num_blocks"] * model["block_size"] + 1)
    jobs = []
    rng = random.Random(repr(shape))
    for prompt_len, gen, start, extra_turns in shape["jobs"]:
        # Shared prefixes now and then, so prefix caching adopts blocks of preempted requests.
        base = [2 + (k * 5) % 60 for k in range(prompt_len)] if rng.random() < 0.3 else \
            [rng.randrange(2, 64) for _ in range(prompt_len)]
        turns, used = [], 0
        for t in range(1 + extra_turns):
            prompt = base if t == 0 else [rng.randrange(2, 64) for _ in range(rng.randrange(1, 6))]
            if used + len(prompt) + gen >= capacity:
                break
            turns.append(Turn(prompt, max_gen=gen))
            used += len(prompt) + gen
        if turns:
            jobs.append(Job(turns, start_run=start))
    if not jobs:
        return
    result = run_workload(model, jobs, stall_limit=4, max_runs=20000)
    assert _without_cached_counts(result.per_job) == _without_cached_counts(expected_workload(jobs, model))
    assert all(k[0] != CAPACITY_BLOCKED for k in result.engine_events)


def _without_cached_counts(per_job):
    # The oracle knows nothing of prefix caching: cached_prompt_tokens depends on what was indexed
    # when each turn was admitted.
    return [[e[:5] + (e[5][:2],) for e in events] for events in per_job]


def _sampled_streams(num_blocks, preemption):
    search = {"do_sample": True, "top_k": 8, "temperature": 1.3}
    _, engine = make_engine(num_blocks=num_blocks, block_size=4, max_batch_size=6, context_length=128,
                            search=search, preemption=preemption)
    reqs = []
    for i in range(6):
        r = engine.create_request()
        t = turn_options(r, max_gen=30, min_gen=30)
        t.set_seed(1000 + i)
        r.begin_turn([2 + (i * 11 + k) % 60 for k in range(18)], t)
        reqs.append(r)
    events = per_request(drive(engine, stall_limit=4))
    return [events[r] for r in reqs], counters(engine)


def test_seeded_sampling_streams_are_unchanged_by_preemption():
    roomy, roomy_counters = _sampled_streams(256, "none")
    tight, tight_counters = _sampled_streams(40, "recompute")
    assert roomy_counters["preemptions"] == 0
    assert tight_counters["preemptions"] > 0
    assert tight == roomy


@pytest.mark.parametrize("kind", ["hybrid", "sliding_window"])
def test_preemption_recomputes_fixed_state_and_window_rings(kind):
    # The test executor checks every fixed-state row and ring block against the token history, so a
    # recompute that left stale state behind fails the step.
    model = dict(num_blocks=24, block_size=4, max_batch_size=4, context_length=128)
    if kind == "hybrid":
        model["hybrid"] = ([0], [1], [2])
    else:
        model.update(sliding_window=(8, [1]), chunk_size=4)
    jobs = _crowd(count=4, prompt_len=14, gen=20)
    result = run_workload(model, jobs, stall_limit=4)
    assert result.per_job == expected_workload(jobs, model)
    assert result.counters["preemptions"] > 0


@pytest.mark.parametrize("prefix_caching, recomputed", [(False, 27), (True, 3)])
def test_prefix_caching_makes_recompute_cheap(prefix_caching, recomputed):
    # One residency slot: B is admitted by preempting turn-complete A, and A's next turn by
    # preempting B. A's cache had held 27 tokens (20 prompt + 8 generated, the last not yet in it);
    # with prefix caching its 6 full blocks were still indexed, so only 3 tokens are prefilled again.
    _, engine = make_engine(max_batch_size=1, num_blocks=64, block_size=4, context_length=128,
                            prefix_caching=prefix_caching)
    prompt_a, prompt_b = prompt_without_eos(8, length=20), prompt_without_eos(8, length=12, offset=1)
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn(prompt_a, turn_options(a, max_gen=8, min_gen=8))
    b.begin_turn(prompt_b, turn_options(b, max_gen=8, min_gen=8))
    events = drive(engine, stall_limit=2)
    assert counters(engine)["preemptions"] == 1 and counters(engine)["recomputed_tokens"] == 0
    a.begin_turn([5, 6, 7], turn_options(a, max_gen=4, min_gen=4))
    events += drive(engine, stall_limit=2)
    assert counters(engine)["preemptions"] == 2
    assert counters(engine)["recomputed_tokens"] == recomputed
    seq = OracleSequence()
    expected = expected_turn_events(1, 20, *seq.turn(prompt_a, max_gen=8, min_gen=8))
    expected += expected_turn_events(2, 3, *seq.turn([5, 6, 7], max_gen=4, min_gen=4))
    assert _without_cached_counts([per_request(events)[a]]) == _without_cached_counts([expected])


def test_retryable_faults_during_preemption_recover():
    jobs = _crowd(count=5, prompt_len=20, gen=24)
    model = dict(num_blocks=30, block_size=4, max_batch_size=5, context_length=128)
    result = run_workload(model, jobs, fault=dict(phase="execute", kind="retryable", skip=3, count=6), stall_limit=8)
    assert result.per_job == expected_workload(jobs, model)
    assert result.counters["rolled_back_steps"] == 6
    assert result.counters["preemptions"] > 0


def test_drafts_of_a_preempted_request_are_dropped_not_refused():
    # A caller cannot see preemption: proposing drafts for a request that is being recomputed is
    # accepted, and the proposal is dropped when the recompute samples the token it was meant for.
    model, engine = make_engine(num_blocks=10, block_size=4, max_batch_size=3, context_length=64,
                                per_token_logits=True)
    prompts = [prompt_without_eos(16, length=6, offset=i, max_session=64) for i in range(3)]
    reqs = [engine.create_request() for _ in prompts]
    for r, p in zip(reqs, prompts):
        r.begin_turn(p, turn_options(r, max_gen=16))
    buf = engine.create_event_buffer(64)
    events = []
    proposed = 0  # proposals made while some request was preempted
    finished = set()
    while engine.has_pending_requests():
        got = run_once(engine, buf)
        events += got
        finished.update(id(e.request) for e in got if e.flags & TURN_FINISHED)
        preempted = counters(engine)["waiting_requests"]
        for r in reqs:  # the preempted ones (waiting to recompute) included
            if id(r) not in finished:
                r.set_draft_tokens([3, 4])
                proposed += preempted > 0
    assert counters(engine)["preemptions"] > 0 and proposed > 0
    got = per_request(events)
    for r, p in zip(reqs, prompts):
        toks, reason = OracleSequence(max_session=64).turn(p, max_gen=16)
        assert [e[2] for e in got[r] if e[0] & 1] == toks  # tokens; drafts may merge steps' events
        assert got[r][-1][3:] == (reason, 0, (len(p), 16, 0))


@pytest.mark.parametrize("value, message", [
    ('"swap"', 'preemption must be "recompute" or "none", got "swap"'),
    ("true", "preemption"),
])
def test_preemption_config_is_validated(value, message):
    import json
    with pytest.raises(RuntimeError, match=message):
        ogt.create_test_model(preemption=json.loads(value))


def _sustained(engine, watched, max_runs, streams=2, start_after=2):
    """Runs while `streams` short requests (8 + 8 tokens) are kept in flight -- each closed when it
    ends and replaced at once -- until every watched request finished its turn; returns (the
    watched requests' events, runs, short requests served)."""
    buf = engine.create_event_buffer(64)
    events, alive, served = [], [], 0
    finished = set()
    for run in range(max_runs):
        got = run_once(engine, buf)
        events += [e for e in got if any(e.request is w for w in watched)]
        finished.update(id(e.request) for e in got if e.flags & TURN_FINISHED and any(e.request is w for w in watched))
        ended = [e.request for e in got if e.flags & TURN_FINISHED and any(e.request is r for r in alive)]
        for r in ended:
            alive = [a for a in alive if a is not r]
            r.close()
        del got, ended
        if len(finished) == len(watched):
            return events, run, served
        while run >= start_after and len(alive) < streams:
            r = engine.create_request()
            served += 1
            r.begin_turn([7 + served % 50] * 8, turn_options(r, 8, 8))
            alive.append(r)
    raise AssertionError(f"starved: {len(finished)} of {len(watched)} watched turns finished in {max_runs} runs "
                         f"({served} short requests served, {counters(engine)['preemptions']} preemptions)")


def test_a_preempted_request_is_not_starved_by_an_arrival_stream():
    # V is preempted mid-turn; short requests keep arriving. Admission is first come, first served
    # with preemption, so they cannot overtake V in the waiting queue forever.
    _, engine = make_engine(num_blocks=16, block_size=4, max_batch_size=4, context_length=128)
    prompt_a = prompt_without_eos(40, length=8, max_session=65)
    prompt_v = prompt_without_eos(30, length=16, max_session=65, offset=3)
    a, v = engine.create_request(), engine.create_request()
    a.begin_turn(prompt_a, turn_options(a, 40, 40))
    v.begin_turn(prompt_v, turn_options(v, 30, 30))
    events, _, _ = _sustained(engine, [a, v], max_runs=2000)
    assert counters(engine)["preemptions"] > 0
    got = per_request(events)
    for r, p, n in ((a, prompt_a, 40), (v, prompt_v, 30)):
        assert got[r] == expected_turn_events(1, len(p), *OracleSequence().turn(p, max_gen=n, min_gen=n))


def test_a_continuation_that_needs_the_whole_pool_is_not_starved():
    # O's continuation needs every block of the pool (64 tokens on 16 x 4): a deferred continuation
    # triggers preemption like a deferred decode, so the short requests in flight give way.
    _, engine = make_engine(num_blocks=16, block_size=4, max_batch_size=4, context_length=128)
    prompt = prompt_without_eos(4, length=24, max_session=65)
    o = engine.create_request()
    o.begin_turn(prompt, turn_options(o, 4, 4))
    first = per_request(drive(engine))[o]
    buf = engine.create_event_buffer(64)
    shorts = [engine.create_request() for _ in range(2)]
    for i, r in enumerate(shorts):
        r.begin_turn([9 + i] * 8, turn_options(r, 8, 8))
    run_once(engine, buf)  # the short requests are running when the continuation begins
    o.begin_turn(list(range(3, 39)), turn_options(o, 1, 1))
    events, _, served = _sustained(engine, [o], max_runs=2000, start_after=0)
    seq = OracleSequence()
    assert first == expected_turn_events(1, 24, *seq.turn(prompt, max_gen=4, min_gen=4))
    assert per_request(events)[o] == expected_turn_events(2, 36, *seq.turn(list(range(3, 39)), max_gen=1, min_gen=1))
