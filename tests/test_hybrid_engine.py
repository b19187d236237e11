"""Hybrid models on the engine (seed "Fixed request-state pools"): the FixedStatePool,
the composite paged + fixed transaction, HybridDecoderIO's bindings and events in scheduler order.

The built-in test executor is a hybrid decoder when the config declares fixed groups: it checks
every row's fixed input against the row's token history (a stale bank, a wrong slot, a missing
zero row or a misordered row fails the step fatally) and writes the new state. Token streams must
equal the greedy oracle of tests/helpers.py (the same stream a request gets alone), and the
committed rows must hold the state the oracle computes independently."""
import random
import struct

import pytest

import oga as og
import oga.testing as ogt
from helpers import (E_CONTRACT, E_EXECUTION, FAILED, GOLDEN, MASK64, R_FAILED, STATE_INIT, TOKEN, TURN_FINISHED,
                     Job, OracleSequence, Turn, drive, expected_workload, key, mix64, next_state, prompt_without_eos,
                     run_once, run_workload, turn_options)

# paged_kv [2], fixed_conv [0, 1], fixed_recurrent [1]: three fixed tensors
HYBRID = ([2], [0, 1], [1])
TENSORS = 3


def hybrid_cfg(**cfg):
    cfg.setdefault("hybrid", HYBRID)
    cfg.setdefault("fixed_state_row_words", 3)
    return cfg


def expected_row(tokens, tensor, words=3):
    """The test executor's fixed row of `tensor` after `tokens` (module docstring of
    src/testing/test_executor.cpp), computed from the oracle's state chain."""
    if not tokens:
        return bytes(8 * words)
    state = STATE_INIT
    for position, token in enumerate(tokens):
        state = next_state(state, token, position)
    w0 = mix64((state + (tensor + 1) * GOLDEN) & MASK64)
    return struct.pack(f"<{words}Q", w0, len(tokens), *[w0 ^ k for k in range(2, words)])


def test_hybrid_model_runs_and_commits_the_state_the_oracle_computes():
    model = ogt.create_test_model(**hybrid_cfg())
    engine = og.Engine(model)
    prompt = prompt_without_eos(6)
    request = engine.create_request()
    request.begin_turn(prompt, turn_options(request, max_gen=6))
    events = drive(engine)
    tokens = [e.token for e in events if e.flags & TOKEN]
    assert tokens == OracleSequence().turn(prompt, max_gen=6)[0]
    slot = ogt.fixed_state_slot(request)
    # The final token is sampled, never processed: the state holds prompt + 5 generated tokens.
    history = prompt + tokens[:-1]
    assert slot["slot"] == 0 and slot["committed_tokens"] == len(history)
    assert slot["state_generation"] == ogt.engine_counters(engine)["committed_steps"]
    for t in range(TENSORS):
        assert ogt.fixed_state_row(request, t) == expected_row(history, t)
    with pytest.raises(RuntimeError, match="out of range"):
        ogt.fixed_state_row(request, TENSORS)


def random_jobs(rng, count):
    jobs = []
    for j in range(count):
        turns = [Turn([rng.randrange(2, 64) for _ in range(rng.randrange(1, 14))], max_gen=rng.randrange(1, 9))
                 for _ in range(rng.randrange(1, 4))]
        jobs.append(Job(turns, start_run=rng.randrange(0, 30)))
    return jobs


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fallback_only", [False, True])
def test_continuous_batching_equals_each_request_alone(seed, fallback_only):
    """Admissions, departures, chunked prefills, continuations and slot reuse (more jobs than slots):
    every stream equals the greedy oracle, and the executor accepted every fixed input."""
    rng = random.Random(seed)
    cfg = hybrid_cfg(max_batch_size=4, max_scheduled_tokens=rng.choice([6, 16, 64]), num_blocks=64)
    jobs = random_jobs(rng, 10)
    setup = (lambda engine: ogt.set_fixed_state_fallback_only(engine, True)) if fallback_only else None
    result = run_workload(cfg, jobs, setup=setup)
    assert result.per_job == expected_workload(jobs, cfg)
    assert (result.counters["fixed_state_direct_steps"] > 0) != fallback_only
    assert result.counters["fixed_state_fallback_steps"] > 0


def test_resident_rows_execute_in_slot_order_but_events_keep_scheduler_order():
    model = ogt.create_test_model(**hybrid_cfg())
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    prompts = [prompt_without_eos(40, offset=i) for i in range(4)]
    a, b, c = (engine.create_request() for _ in range(3))
    for r, p in zip((a, b, c), prompts):
        r.begin_turn(p, turn_options(r, max_gen=30))
    run_once(engine, buffer)  # one prefill step admits all three: slots 0, 1, 2
    assert [ogt.fixed_state_slot(r)["slot"] for r in (a, b, c)] == [0, 1, 2]
    a.close()
    assert ogt.fixed_state_slot(a)["slot"] == -1
    d = engine.create_request()
    d.begin_turn(prompts[3], turn_options(d, max_gen=30))
    run_once(engine, buffer)  # b, c decode beside d's prefill (fallback: an admission)
    assert ogt.fixed_state_slot(d)["slot"] == 0  # the lowest free slot
    assert ogt.fixed_state_slot(d)["allocation_generation"] == 2  # a's slot, a new owner
    assert not ogt.last_step_inputs(engine)["fixed_state_direct"]
    events = run_once(engine, buffer)  # all resident, slots 0..2: one direct interval
    inputs = ogt.last_step_inputs(engine)
    assert inputs["fixed_state_direct"] and inputs["num_fixed_states"] == TENSORS
    # Executed in slot order d, b, c; events in the scheduler's (admission) order b, c, d.
    assert list(inputs["past_sequence_lengths"]) == [len(prompts[3]), len(prompts[1]) + 1, len(prompts[2]) + 1]
    assert [e.request for e in events] == [b, c, d]
    drive(engine)
    oracle = [OracleSequence().turn(p, max_gen=30)[0] for p in prompts]
    for r, p, expected in ((b, prompts[1], oracle[1]), (c, prompts[2], oracle[2]), (d, prompts[3], oracle[3])):
        slot = ogt.fixed_state_slot(r)
        assert slot["committed_tokens"] == len(p) + len(expected) - 1


def test_minority_banks_are_normalized_and_bound_directly():
    """A request that sat out steps (turn complete) is on the other bank than its neighbour when it
    continues; the pool copies it into the majority bank and still binds the interval directly."""
    model = ogt.create_test_model(**hybrid_cfg())
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    pa, pb = prompt_without_eos(12), prompt_without_eos(12, offset=1)
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn(pa, turn_options(a, max_gen=2))
    b.begin_turn(pb, turn_options(b, max_gen=7))
    drive(engine, buffer)
    # a stopped flipping after 2 committed steps, b after 7: their states sit on different banks.
    assert [ogt.fixed_state_slot(r)["state_generation"] for r in (a, b)] == [2, 7]
    assert ogt.fixed_state_slot(a)["active_bank"] != ogt.fixed_state_slot(b)["active_bank"]
    a_before = [ogt.fixed_state_row(a, t) for t in range(TENSORS)]
    a.begin_turn([5, 6], turn_options(a, max_gen=3))
    b.begin_turn([7], turn_options(b, max_gen=3))
    run_once(engine, buffer)
    assert ogt.last_step_inputs(engine)["fixed_state_direct"]
    assert ogt.fixed_state_slot(a)["active_bank"] == ogt.fixed_state_slot(b)["active_bank"]
    drive(engine, buffer)
    seq_a, seq_b = OracleSequence(), OracleSequence()
    ta, _ = seq_a.turn(pa, max_gen=2)
    tb, _ = seq_b.turn(pb, max_gen=7)
    assert a_before == [expected_row(pa + ta[:-1], t) for t in range(TENSORS)]
    ta2, _ = seq_a.turn([5, 6], max_gen=3)
    tb2, _ = seq_b.turn([7], max_gen=3)
    for r, seq, last in ((a, seq_a, ta2), (b, seq_b, tb2)):
        history = seq.tokens[:-1]
        assert [ogt.fixed_state_row(r, t) for t in range(TENSORS)] == [expected_row(history, t) for t in range(TENSORS)]


def snapshot(requests):
    return [(ogt.fixed_state_slot(r), [ogt.fixed_state_row(r, t) for t in range(TENSORS)]) for r in requests]


@pytest.mark.parametrize("phase,kind,flag", [
    ("execute", "retryable", "retryable"),
    ("execute", "capacity", "capacity"),
    ("sample", "retryable", "retryable"),
])
def test_retryable_failures_leave_every_active_bank_and_generation_untouched(phase, kind, flag):
    model = ogt.create_test_model(**hybrid_cfg())
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    prompts = [prompt_without_eos(10, offset=i) for i in range(3)]
    requests = [engine.create_request() for _ in prompts]
    for r, p in zip(requests[:2], prompts):
        r.begin_turn(p, turn_options(r, max_gen=10))
    run_once(engine, buffer)
    run_once(engine, buffer)
    requests[2].begin_turn(prompts[2], turn_options(requests[2], max_gen=10))  # an admission in the failing step
    before = snapshot(requests[:2])
    ogt.inject_fault(model, phase, kind)
    events = run_once(engine, buffer)
    assert len(events) == 1 and events[0].request is None
    assert snapshot(requests[:2]) == before
    assert ogt.fixed_state_slot(requests[2])["slot"] == -1  # the provisional slot went back
    assert ogt.engine_counters(engine)["rolled_back_steps"] == 1
    # Direct steps too: fail one after the admission committed.
    run_once(engine, buffer)
    run_once(engine, buffer)
    before = snapshot(requests)
    ogt.inject_fault(model, phase, kind)
    run_once(engine, buffer)
    assert snapshot(requests) == before
    events = drive(engine, buffer)
    streams = {id(r): [] for r in requests}
    for r, p in zip(requests, prompts):
        streams[id(r)] = OracleSequence().turn(p, max_gen=10)[0]
    assert ogt.engine_counters(engine)["fixed_state_direct_steps"] > 0
    for r in requests:
        assert ogt.fixed_state_slot(r)["committed_tokens"] == len(prompts[requests.index(r)]) + 9


@pytest.mark.parametrize("phase,code", [
    ("fixed_state_prepare", E_EXECUTION),
    ("commit_prepare", E_CONTRACT),
    ("reserve", E_CONTRACT),
])
def test_a_failed_fixed_state_preparation_poisons_the_engine_with_committed_state_intact(phase, code):
    model = ogt.create_test_model(**hybrid_cfg())
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    prompts = [prompt_without_eos(10, offset=i) for i in range(4)]
    requests = [engine.create_request() for _ in prompts]
    for r, p in zip(requests, prompts):
        r.begin_turn(p, turn_options(r, max_gen=10))
    run_once(engine, buffer)
    before = snapshot(requests)
    ogt.inject_fault(model, phase)
    events = run_once(engine, buffer)
    assert [e.request for e in events] == requests
    assert all(e.flags & FAILED and e.flags & TURN_FINISHED and e.error_code == code for e in events)
    assert snapshot(requests) == before  # every active bank, generation and boundary intact
    with pytest.raises(RuntimeError, match="no longer healthy"):
        engine.run(buffer)


def test_close_and_abandonment_release_the_slot_for_a_new_owner():
    import gc

    model = ogt.create_test_model(**hybrid_cfg(max_batch_size=2))
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn([3, 4, 5], turn_options(a, max_gen=2))
    b.begin_turn([6, 7], turn_options(b, max_gen=2))
    drive(engine, buffer)
    assert sorted(ogt.fixed_state_slot(r)["slot"] for r in (a, b)) == [0, 1]
    slot_b = ogt.fixed_state_slot(b)["slot"]
    a.close()
    del b
    gc.collect()
    c, d = engine.create_request(), engine.create_request()
    c.begin_turn([8, 9], turn_options(c, max_gen=3))
    d.begin_turn([10, 11, 12], turn_options(d, max_gen=3))
    events = drive(engine, buffer)
    assert sorted(ogt.fixed_state_slot(r)["slot"] for r in (c, d)) == [0, 1]
    assert all(ogt.fixed_state_slot(r)["allocation_generation"] == 2 for r in (c, d))
    assert [e.token for e in events if e.request is c and e.flags & TOKEN] == OracleSequence().turn([8, 9], 3)[0]
    assert slot_b in (0, 1)


def test_rewind_releases_the_slot_and_the_next_turn_starts_from_zero_state():
    model = ogt.create_test_model(**hybrid_cfg())
    engine = og.Engine(model)
    request = engine.create_request()
    p1, p2 = prompt_without_eos(5), [9, 10, 11]
    request.begin_turn(p1, turn_options(request, max_gen=4))
    drive(engine)
    request.begin_turn(p2, turn_options(request, max_gen=4))
    drive(engine)
    request.rewind_to_start_of_turn(2)
    assert ogt.fixed_state_slot(request)["slot"] == -1
    p3 = [12, 13]
    request.begin_turn(p3, turn_options(request, max_gen=4))
    events = drive(engine)
    seq = OracleSequence()
    t1, _ = seq.turn(p1, max_gen=4)
    t3, _ = seq.turn(p3, max_gen=4)
    assert [e.token for e in events if e.flags & TOKEN] == t3
    history = seq.tokens[:-1]
    assert [ogt.fixed_state_row(request, t) for t in range(TENSORS)] == [expected_row(history, t) for t in range(TENSORS)]


def test_drafts_need_the_decoders_per_token_state():
    engine = og.Engine(ogt.create_test_model(**hybrid_cfg(per_token_logits=True)))
    assert engine.max_draft_tokens_per_proposal() == 0
    engine = og.Engine(ogt.create_test_model(**hybrid_cfg(per_token_logits=True, fixed_state_capture=True)))
    assert engine.max_draft_tokens_per_proposal() == 7


@pytest.mark.parametrize("seed", range(4))
def test_partially_accepted_drafts_replay_the_accepted_state(seed):
    """Proposals that are right for a random prefix, then wrong: the commit keeps the state after the
    last accepted token (compact replay from the captured per-token state), which the next step's
    fixed input check and the final rows prove."""
    rng = random.Random(seed)
    model = ogt.create_test_model(**hybrid_cfg(per_token_logits=True, fixed_state_capture=True,
                                               max_batch_size=4))
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    prompts = [prompt_without_eos(30, offset=i) for i in range(3)]
    oracle = [OracleSequence().turn(p, max_gen=30)[0] for p in prompts]
    requests = [engine.create_request() for _ in prompts]
    for r, p in zip(requests, prompts):
        r.begin_turn(p, turn_options(r, max_gen=30))
    streams = [[] for _ in prompts]
    partial = 0
    while engine.has_pending_requests():
        for i, r in enumerate(requests):
            done = len(streams[i])
            if 0 < done < 30:
                want = oracle[i][done:done + rng.randrange(1, 6)]
                keep = rng.randrange(0, len(want) + 1)
                drafts = want[:keep] + [(t % 60) + 2 if t != (t % 60) + 2 else 3 for t in want[keep:]]
                partial += keep < len(want)
                r.set_draft_tokens(drafts)
        for e in run_once(engine, buffer):
            if e.flags & TOKEN:
                streams[requests.index(e.request)].append(e.token)
    assert streams == oracle
    assert partial > 0
    for r, p, tokens in zip(requests, prompts, oracle):
        history = p + tokens[:-1]
        assert [ogt.fixed_state_row(r, t) for t in range(TENSORS)] == [expected_row(history, t) for t in range(TENSORS)]


def cached_turn(engine, prompt, max_gen=1, request=None):
    """One greedy turn; returns (request, tokens, cached_prompt_tokens). Checks the oracle."""
    request = request or engine.create_request()
    request.begin_turn(prompt, turn_options(request, max_gen=max_gen))
    events = drive(engine)
    tokens = [e.token for e in events if e.request is request and e.flags & TOKEN]
    finished = [e for e in events if e.request is request and e.flags & TURN_FINISHED]
    return request, tokens, finished[-1].usage[2]


def checkpoint_engine(**cfg):
    # prefix caching as 0.18 runs it by default (key absent); 16-token steps of 4-token blocks
    return og.Engine(ogt.create_test_model(**hybrid_cfg(prefix_caching=None, max_scheduled_tokens=16, **cfg)))


def test_prefix_caching_adopts_blocks_up_to_a_fixed_state_checkpoint():
    """As onnxruntime-genai 0.18 does for hybrid models (observed on the builder's hybrid decoders):
    a prefill step that ends on a block boundary leaves a fixed-state checkpoint; a new prompt adopts
    cached blocks only up to the last checkpoint its prefix reaches. The test executor checks the
    adopted state (the checkpoint) against the token history."""
    engine = checkpoint_engine()
    p27 = list(range(3, 30))
    r1, t1, c1 = cached_turn(engine, p27, 3)
    r2, t2, c2 = cached_turn(engine, p27, 3)
    assert (c1, c2) == (0, 16)  # steps [0, 16) and [16, 27): one checkpoint, at 16
    assert t1 == t2 == OracleSequence().turn(p27, max_gen=3)[0]
    p40 = [2 + (5 * i) % 61 for i in range(40)]
    cached_turn(engine, p40, 2)
    assert cached_turn(engine, p40, 2)[2] == 32  # checkpoints at 16 and 32
    p16 = list(range(5, 21))
    assert cached_turn(engine, p16, 2)[2] == 0
    assert cached_turn(engine, p16, 2)[2] == 0  # at most 12 adoptable tokens: no checkpoint there
    assert cached_turn(engine, p16 + [50, 51, 52, 53], 2)[2] == 16  # the step that ended the prompt at 16
    # decode steps leave no checkpoint: 10 prompt tokens + 8 generated reach 16 by decoding
    p10 = list(range(30, 40))
    _, gen, _ = cached_turn(engine, p10, 12)
    assert cached_turn(engine, p10 + gen[:8], 1)[2] == 0
    # a continuation prefill that ends on a boundary does
    a, ta, _ = cached_turn(engine, [20 + i for i in range(10)], 3)
    a, ta2, _ = cached_turn(engine, [50, 51, 52], 2, request=a)
    history = [20 + i for i in range(10)] + ta + [50, 51, 52]
    assert len(history) == 16
    assert cached_turn(engine, history + ta2[:1] + [60, 61, 62], 1)[2] == 16


def test_fixed_state_checkpoints_are_replaced_least_recently_used_first():
    """max_batch_size checkpoints (0.18 keeps that many): re-running the most recent prompts finds
    exactly that many; adoption counts as use."""
    for slots in (2, 4):
        engine = checkpoint_engine(max_batch_size=slots, num_blocks=256)
        prompts = [[3 + k] + [3 + (k * 7 + j * 3) % 60 for j in range(16)] for k in range(10)]
        for p in prompts:
            r, _, _ = cached_turn(engine, p)
            r.close()
        hits = []
        for p in reversed(prompts[-6:]):
            r, _, cached = cached_turn(engine, p + [5])
            r.close()
            hits.append(cached)
        assert hits == [16] * slots + [0] * (6 - slots)
        ogt.check_invariants(engine)


def test_a_full_checkpoint_pool_replaces_a_shorter_prefix_of_the_same_tokens_first():
    """A 40-token prompt leaves checkpoints at 16, 32 and 40; a 33-token one at 16 and 32: with four
    checkpoints the fifth replaces the second prompt's own 16, not the oldest (the first prompt's
    16), as 0.18 does. Each probe runs on a fresh engine after the same history."""
    a = [2 + (5 * i) % 61 for i in range(40)]
    b = list(range(30, 46)) + [5] * 16 + [6]
    probes = {"a16": (a[:16] + [9], 16), "a32": (a[:32] + [9], 32), "b16": (b[:16] + [9], 0),
              "b32": (b[:32] + [9], 32)}
    for name, (prompt, cached) in probes.items():
        engine = checkpoint_engine(max_batch_size=4, num_blocks=256)
        for history in (a, b):
            r, _, _ = cached_turn(engine, history)
            r.close()
        assert cached_turn(engine, prompt)[2] == cached, name


def test_prefix_caching_false_keeps_hybrid_prompts_uncached():
    engine = og.Engine(ogt.create_test_model(**hybrid_cfg(prefix_caching=False, max_scheduled_tokens=16)))
    p27 = list(range(3, 30))
    assert [cached_turn(engine, p27)[2] for _ in range(2)] == [0, 0]


@pytest.mark.parametrize("seed", range(4))
def test_checkpointed_adoption_in_a_busy_workload_keeps_every_stream(seed):
    """Shared prompt prefixes, chunked prefills, slot and checkpoint reuse under a small block pool
    (evictions): streams equal the oracle; the executor accepts every adopted state."""
    rng = random.Random(100 + seed)
    base = [rng.randrange(2, 64) for _ in range(24)]
    jobs = [Job([Turn(base + [5], max_gen=2)])]  # alone first: its 8- or 16-token steps leave checkpoints
    for _ in range(12):
        cut = rng.choice([0, 8, 12, 16, 20, 24])
        prompt = base[:cut] + [rng.randrange(2, 64) for _ in range(rng.randrange(1, 10))]
        jobs.append(Job([Turn(prompt, max_gen=rng.randrange(1, 6))], start_run=rng.randrange(6, 40)))
    cfg = hybrid_cfg(prefix_caching=None, max_batch_size=3, max_scheduled_tokens=rng.choice([8, 16]),
                     num_blocks=40)
    result = run_workload(cfg, jobs)
    expected = expected_workload(jobs, cfg)
    strip = lambda evs: [e[:5] for e in evs]  # usage differs by what was adopted
    assert [strip(e) for e in result.per_job] == [strip(e) for e in expected]
    assert sum(e[5][2] for evs in result.per_job for e in evs) > 0


def test_fallback_only_is_rejected_for_models_without_fixed_state():
    engine = og.Engine(ogt.create_test_model())
    with pytest.raises(RuntimeError, match="no fixed decoder state"):
        ogt.set_fixed_state_fallback_only(engine, True)
    request = engine.create_request()
    assert ogt.fixed_state_slot(request)["slot"] == -1


# --------------------------------------------------------------------------------------------
# Fixed state on a (simulated) device: OgaExtDeviceOps
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(3))
def test_fixed_state_on_a_device_keeps_every_stream(seed):
    rng = random.Random(50 + seed)
    cfg = hybrid_cfg(max_batch_size=4, max_scheduled_tokens=16, num_blocks=64, device_ops=True)
    jobs = random_jobs(rng, 8)
    result = run_workload(cfg, jobs)
    assert result.per_job == expected_workload(jobs, cfg)
    assert result.counters["fixed_state_direct_steps"] > 0 and result.counters["fixed_state_fallback_steps"] > 0


def test_a_failed_device_copy_poisons_the_engine_with_committed_state_intact():
    for skip, code, text in ((0, E_CONTRACT, "Transaction preparation failed"),
                             (TENSORS, E_EXECUTION, "Transaction commit preparation failed")):
        model = ogt.create_test_model(**hybrid_cfg(device_ops=True))
        engine = og.Engine(model)
        ogt.set_fixed_state_fallback_only(engine, True)  # every step gathers, then stages
        buffer = engine.create_event_buffer(64)
        requests = [engine.create_request() for _ in range(3)]
        for r, p in zip(requests, ([5, 6, 7], [8, 9], [10, 11, 12, 13])):
            r.begin_turn(p, turn_options(r, max_gen=8))
        run_once(engine, buffer)
        before = [ogt.fixed_state_slot(r) for r in requests]  # device rows are not readable from the host
        # skip 0: the reservation's gather fails; skip TENSORS: the gathers pass, commit preparation fails
        ogt.inject_fault(model, "device_copy", skip=skip)
        events = run_once(engine, buffer)
        assert all(e.flags & FAILED and e.error_code == code for e in events) and len(events) == 3
        assert [ogt.fixed_state_slot(r) for r in requests] == before
        with pytest.raises(RuntimeError, match="lives in device memory"):
            ogt.fixed_state_row(requests[0], 0)
        with pytest.raises(RuntimeError, match=text + ".*simulated device: copy of 3 rows failed"):
            engine.run(buffer)


def test_a_recomputed_chain_whose_twin_was_evicted_stays_private():
    """Found in review: a recomputed duplicate prefix continues its indexed twin's chain only while
    that chain is still indexed; with part of it evicted between two prefill chunks, the new blocks
    must not be indexed as the start of a prompt (a later prompt starting with those mid-prompt
    tokens would adopt KV written at other positions)."""
    model = ogt.create_test_model(**hybrid_cfg(prefix_caching=None, block_size=4, num_blocks=7, max_batch_size=3,
                                               max_scheduled_tokens=10))
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)

    def turn(prompt, max_gen=1):
        r = engine.create_request()
        r.begin_turn(prompt, turn_options(r, max_gen=max_gen))
        return r

    x_prompt = [2 + (7 * i) % 60 for i in range(19)]
    x = turn(x_prompt)
    drive(engine, buffer)
    x.close()  # x's blocks indexed and evictable, no checkpoint (its steps end at 10 and 19)
    r = turn(x_prompt[:16] + [40])
    run_once(engine, buffer)  # r's [0, 10) evicts two of x's blocks; r's first two are private twins
    y = turn([50, 51, 52])  # admitted beside r's next chunk: evicts another of x's blocks
    drive(engine, buffer)
    r.close()
    y.close()
    z = turn(x_prompt[8:12])
    drive(engine, buffer)
    z.close()
    w = turn(x_prompt[8:12] + [33], max_gen=2)
    events = drive(engine, buffer)
    mine = [e for e in events if e.request is w]
    assert not any(e.flags & FAILED for e in mine)
    assert [e.token for e in mine if e.flags & TOKEN] == OracleSequence().turn(x_prompt[8:12] + [33], max_gen=2)[0]
