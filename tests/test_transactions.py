"""Step transactions: fault injection at every phase, rollback equivalence, fatal failure handling."""

import pytest

import oga.testing as ogt
from helpers import (
    CAPACITY_BLOCKED, E_CONTRACT, E_EXEC_CAPACITY, E_EXECUTION, E_RETRYABLE, FAILED, R_FAILED, R_NONE,
    RETRYABLE, TOKEN, TURN_FINISHED, Job, OracleSequence, Turn, counters, drive, expected_workload, key,
    make_engine, prompt_without_eos, run_once, run_workload, turn_options,
)

FATAL_PREFIXES = (
    "Model execution failed and the Engine is no longer healthy. Cause: ",
    "Transaction commit failed and the Engine is no longer healthy.",
    "Transaction preparation failed and the Engine is no longer healthy.",
    "Transaction rollback failed and the Engine is no longer healthy.",
    "Dynamic scheduler planning failed and the Engine is no longer healthy.",
)
RETRY_EVENT = (RETRYABLE, 0, None, R_NONE, E_RETRYABLE, (0, 0, 0))
EXEC_CAPACITY_EVENT = (CAPACITY_BLOCKED, 0, None, R_NONE, E_EXEC_CAPACITY, (0, 0, 0))

# A workload that interleaves chunked prefills, decodes, a continuation and a late long prompt.
CFG = dict(max_scheduled_tokens=8, chunk_size=3, max_batch_size=4)
JOBS = [
    Job([Turn([5, 9, 13, 2, 3, 4, 5], max_gen=8), Turn([7, 8], max_gen=5)]),
    Job([Turn([7, 7], max_gen=10)]),
    Job([Turn([20, 21, 22, 23, 24, 25, 26, 27, 28, 29], max_gen=6), Turn([3], max_gen=4)]),
    Job([Turn([40], max_gen=16), Turn([41, 42], max_gen=10)]),
    Job([Turn(list(range(30, 43)), max_gen=5)]),
]


@pytest.fixture(scope="module")
def clean():
    result = run_workload(CFG, JOBS)
    assert result.per_job == expected_workload(JOBS, CFG)
    assert result.engine_events == []
    assert result.counters["rolled_back_steps"] == 0
    assert result.counters["committed_steps"] >= 26
    return result


def _strip(all_events, engine_key):
    out = [e for e in all_events if e != (None, engine_key)]
    assert len(out) == len(all_events) - 1
    return out


def _check_rollback_equivalence(clean, fault, engine_key, extra_model_runs=1):
    res = run_workload(CFG, JOBS, fault=fault)
    assert res.engine_events == [engine_key]
    assert res.per_job == clean.per_job
    assert _strip(res.all_events, engine_key) == clean.all_events
    assert res.counters["rolled_back_steps"] == 1
    assert res.counters["committed_steps"] == clean.counters["committed_steps"]
    assert res.counters["model_runs"] == clean.counters["model_runs"] + extra_model_runs
    assert res.counters["free_blocks"] == res.counters["total_blocks"]


def test_clean_workload_matches_oracle(clean):
    pass


@pytest.mark.parametrize("skip", range(0, 26))
def test_retryable_execution_rolls_back_at_every_step(clean, skip):
    if skip >= clean.counters["committed_steps"]:
        pytest.fail("workload is shorter than the sweep")
    _check_rollback_equivalence(clean, dict(phase="execute", kind="retryable", skip=skip), RETRY_EVENT)


@pytest.mark.parametrize("skip", [0, 1, 4, 7, 11, 16])
def test_execution_capacity_rolls_back(clean, skip):
    _check_rollback_equivalence(clean, dict(phase="execute", kind="capacity", skip=skip), EXEC_CAPACITY_EVENT)


@pytest.mark.parametrize("skip", [0, 2, 5, 9, 14, 20])
def test_sampling_failure_rolls_back(clean, skip):
    _check_rollback_equivalence(clean, dict(phase="sample", skip=skip), RETRY_EVENT)


@pytest.mark.parametrize("count", [2, 3])
def test_repeated_retryable_failures(clean, count):
    res = run_workload(CFG, JOBS, fault=dict(phase="execute", kind="retryable", skip=3, count=count))
    assert res.engine_events == [RETRY_EVENT] * count
    assert res.per_job == clean.per_job
    assert [e for e in res.all_events if e[0] is not None] == [e for e in clean.all_events if e[0] is not None]
    assert res.counters["rolled_back_steps"] == count


@pytest.mark.parametrize("skip", [0, 3, 8])
def test_planning_failure_escapes_run_and_leaves_engine_healthy(clean, skip):
    res = run_workload(CFG, JOBS, fault=dict(phase="plan", skip=skip), allow_run_errors=True)
    assert len(res.run_errors) == 1
    assert "no longer healthy" not in res.run_errors[0]
    assert res.engine_events == []
    assert res.per_job == clean.per_job
    assert res.all_events == clean.all_events
    assert res.counters["model_runs"] == clean.counters["model_runs"]
    assert res.counters["rolled_back_steps"] == 0


def test_rollback_restores_committed_state_exactly():
    model, engine = make_engine(chunk_size=2)
    a, b = engine.create_request(), engine.create_request()
    pa, pb = prompt_without_eos(6, length=5), prompt_without_eos(6, length=2, offset=1)
    a.begin_turn(pa, turn_options(a, max_gen=6))
    b.begin_turn(pb, turn_options(b, max_gen=6))
    buf = engine.create_event_buffer(8)
    events = run_once(engine, buf) + run_once(engine, buf)
    before = counters(engine)
    ogt.inject_fault(model, "execute", "retryable")
    evs = run_once(engine, buf)
    assert [key(e) for e in evs] == [RETRY_EVENT]
    assert evs[0].request is None
    after = counters(engine)
    for k in ("free_blocks", "resident_requests", "waiting_requests", "bound_requests", "committed_steps",
              "retained_events"):
        assert after[k] == before[k], k
    assert after["rolled_back_steps"] == before["rolled_back_steps"] + 1
    assert engine.has_pending_requests()
    events += drive(engine, buf)
    for r, p in ((a, pa), (b, pb)):
        toks, reason = OracleSequence().turn(p, max_gen=6)
        assert [e.token for e in events if e.request is r] == toks


def _poison_scenario(phase, kind="retryable", capacity=64):
    """C: turn-complete resident (not executable); A: active (2 tokens committed); B: queued behind
    residency. The fault hits A's next step."""
    model, engine = make_engine(max_batch_size=2)
    c = engine.create_request()
    c.begin_turn([5, 9, 13], turn_options(c, max_gen=1))
    drive(engine)
    a = engine.create_request()
    pa = prompt_without_eos(6)
    a.begin_turn(pa, turn_options(a, max_gen=10))
    buf = engine.create_event_buffer(capacity)
    big = engine.create_event_buffer(64)
    run_once(engine, big)
    run_once(engine, big)
    b = engine.create_request()
    b.begin_turn([7, 7, 7, 7])
    ogt.inject_fault(model, phase, kind)
    return model, engine, buf, a, b, c


def _assert_poisoned(engine, buf, a, b, c, message_prefix):
    with pytest.raises(RuntimeError) as info:
        engine.run(buf)
    msg = str(info.value)
    assert msg.startswith(message_prefix), msg
    assert not engine.has_pending_requests()
    with pytest.raises(RuntimeError) as info2:
        engine.run(buf)
    assert str(info2.value) == msg
    with pytest.raises(RuntimeError) as info3:
        engine.create_request()
    assert str(info3.value) == msg
    with pytest.raises(RuntimeError) as info4:
        c.begin_turn([4])
    assert str(info4.value) == msg
    for r in (a, b, c):
        r.close()
        r.close()
    return msg


@pytest.mark.parametrize("phase,kind,code,prefix", [
    ("execute", "fatal", E_EXECUTION, "Model execution failed and the Engine is no longer healthy. Cause: "),
    ("reserve", "retryable", E_CONTRACT, None),
    ("commit_prepare", "retryable", E_CONTRACT, None),
])
def test_fatal_failure_fails_every_executable_turn(phase, kind, code, prefix):
    model, engine, buf, a, b, c = _poison_scenario(phase, kind)
    zero = engine.create_event_buffer(0)
    evs = run_once(engine, buf, check=False)
    got = {e.request: key(e) for e in evs}
    assert len(evs) == 2 and set(got) == {a, b}
    assert got[a] == (TURN_FINISHED | FAILED, 1, None, R_FAILED, code, (3, 2, 0))
    assert got[b] == (TURN_FINISHED | FAILED, 1, None, R_FAILED, code, (4, 0, 0))
    msg = _assert_poisoned(engine, buf, a, b, c, prefix or "")
    assert any(msg.startswith(p) for p in FATAL_PREFIXES), msg
    with pytest.raises(RuntimeError) as info:
        engine.run(zero)
    assert str(info.value) == msg


def test_commit_failure_is_fatal():
    model, engine, buf, a, b, c = _poison_scenario("commit")
    evs = run_once(engine, buf, check=False)
    requests = [e.request for e in evs]
    assert set(requests) == {a, b} and len(requests) == 2
    for e in evs:
        assert e.flags & (TURN_FINISHED | FAILED) == TURN_FINISHED | FAILED
        assert e.error_code == E_EXECUTION and e.finish_reason == R_FAILED
    msg = _assert_poisoned(engine, buf, a, b, c, "")
    assert any(msg.startswith(p) for p in FATAL_PREFIXES), msg


def test_fatal_events_are_retained_and_drained_before_the_error():
    model, engine, one, a, b, c = _poison_scenario("execute", "fatal", capacity=1)
    first = run_once(engine, one, check=False)
    assert len(first) == 1
    assert engine.has_pending_requests()
    second = run_once(engine, one, check=False)
    assert len(second) == 1
    assert {first[0].request, second[0].request} == {a, b}
    assert all(e.error_code == E_EXECUTION for e in first + second)
    assert not engine.has_pending_requests()
    with pytest.raises(RuntimeError, match="^Model execution failed and the Engine is no longer healthy. Cause: "):
        engine.run(one)


def test_fatal_failure_of_a_pure_prefill_step():
    model, engine = make_engine()
    ogt.inject_fault(model, "execute", "fatal")
    r = engine.create_request()
    r.begin_turn([5, 9, 13])
    evs = run_once(engine, engine.create_event_buffer(4), check=False)
    assert [key(e) for e in evs] == [(TURN_FINISHED | FAILED, 1, None, R_FAILED, E_EXECUTION, (3, 0, 0))]
    assert evs[0].request is r
    assert not engine.has_pending_requests()
    with pytest.raises(RuntimeError, match="^Model execution failed and the Engine is no longer healthy. Cause: "):
        engine.run(engine.create_event_buffer(4))
    r.close()


def test_faults_only_for_test_models_and_known_names(model):
    with pytest.raises(ValueError):
        ogt.inject_fault(model, "nowhere")
    with pytest.raises(ValueError):
        ogt.inject_fault(model, "execute", "sometimes")


def test_fault_injection_is_replaced_by_rearming():
    model, engine = make_engine()
    ogt.inject_fault(model, "execute", "retryable", skip=0, count=5)
    ogt.inject_fault(model, "execute", "retryable", skip=1, count=1)
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=4))
    events = drive(engine)
    assert [key(e) for e in events if e.request is None] == [RETRY_EVENT]
    assert [e.flags for e in events if e.request is not None][-1] == TOKEN | TURN_FINISHED
    assert counters(engine)["rolled_back_steps"] == 1


def test_planning_consistency_failure_poisons_every_executable_turn():
    model, engine, buf, a, b, c = _poison_scenario("plan", "fatal")
    evs = run_once(engine, buf, check=False)
    got = {e.request: key(e) for e in evs}
    assert set(got) == {a, b} and len(evs) == 2
    assert got[a] == (TURN_FINISHED | FAILED, 1, None, R_FAILED, E_CONTRACT, (3, 2, 0))
    assert got[b] == (TURN_FINISHED | FAILED, 1, None, R_FAILED, E_CONTRACT, (4, 0, 0))
    _assert_poisoned(engine, buf, a, b, c,
                     "Dynamic scheduler planning failed and the Engine is no longer healthy. Cause: ")


def test_fatal_failure_without_an_executable_turn_publishes_a_requestless_failed_event():
    model, engine = make_engine()
    done = engine.create_request()
    done.begin_turn([5, 9, 13], turn_options(done, max_gen=1))
    drive(engine)  # turn-complete resident: nothing executable
    ogt.inject_fault(model, "plan", "fatal")
    buf = engine.create_event_buffer(4)
    evs = run_once(engine, buf, check=False)
    assert [key(e) for e in evs] == [(FAILED, 0, None, R_NONE, E_CONTRACT, (0, 0, 0))]
    assert evs[0].request is None
    assert not engine.has_pending_requests()
    with pytest.raises(RuntimeError, match="^Dynamic scheduler planning failed and the Engine is no longer healthy."):
        engine.run(buf)
    done.close()
