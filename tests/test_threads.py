"""Owner-thread enforcement, off-thread final release (abandonment), and GIL release in run."""

import gc
import sys
import threading
import time

import pytest

import oga as og
import oga.testing as ogt
from helpers import OracleSequence, counters, drive, expected_turn_events, key, make_engine, turn_options

OWNER = "Engine operations must be called from the Engine owner thread."


def on_thread(fn):
    """Runs fn on a new thread; returns (result, exception)."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["exc"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join(30)
    assert not t.is_alive()
    return box.get("result"), box.get("exc")


def _setup():
    model, engine = make_engine()
    buf = engine.create_event_buffer(8)
    zero = engine.create_event_buffer(0)
    done = engine.create_request()
    done.begin_turn([5, 9, 13], turn_options(done, max_gen=2))
    drive(engine, buf)
    live = engine.create_request()
    live.begin_turn([7, 7], turn_options(live, max_gen=4))
    fresh = engine.create_request()
    opts = turn_options(done, max_gen=3)
    return model, engine, buf, zero, done, live, fresh, opts


def _owner_ops(engine, buf, zero, done, live, fresh, opts):
    return {
        "run": lambda: engine.run(buf),
        "run_capacity_zero": lambda: engine.run(zero),
        "run_max_events": lambda: engine.run(max_events=4),
        "has_pending_requests": engine.has_pending_requests,
        "create_request": engine.create_request,
        "create_event_buffer": lambda: engine.create_event_buffer(4),
        "get_capabilities": engine.get_capabilities,
        "get_speculative_stats": engine.get_speculative_stats,
        "max_draft_tokens_per_proposal": engine.max_draft_tokens_per_proposal,
        "begin_turn": lambda: done.begin_turn([4], opts),
        "begin_turn_first": lambda: fresh.begin_turn([4]),
        "cancel_turn": lambda: live.cancel_turn(1),
        "close": live.close,
        "rewind": lambda: done.rewind_to_start_of_turn(1),
        "set_draft_tokens": lambda: live.set_draft_tokens([3]),
        "create_turn_options": lambda: og.TurnOptions(done),
        "turn_options_set_max": lambda: opts.set_max_generated_tokens(5),
        "turn_options_set_min": lambda: opts.set_min_generated_tokens(1),
        "turn_options_reset": opts.reset,
        "turn_options_set_do_sample": lambda: opts.set_do_sample(True),
        "turn_options_set_temperature": lambda: opts.set_temperature(0.5),
        "turn_options_set_top_p": lambda: opts.set_top_p(0.5),
        "turn_options_set_top_k": lambda: opts.set_top_k(2),
        "turn_options_set_repetition_penalty": lambda: opts.set_repetition_penalty(1.5),
        "turn_options_set_no_repeat_ngram_size": lambda: opts.set_no_repeat_ngram_size(1),
        "turn_options_set_seed": lambda: opts.set_seed(7),
        "turn_options_clear_seed": opts.clear_seed,
        "turn_options_set_stop_strings": lambda: opts.set_stop_strings(["x"]),
        "turn_options_set_guidance": lambda: opts.set_guidance("regex", "[a-z]+"),
        "turn_options_clear_guidance": opts.clear_guidance,
        "check_invariants": lambda: ogt.check_invariants(engine),
    }


OP_NAMES = [
    "run", "run_capacity_zero", "run_max_events", "has_pending_requests", "create_request", "create_event_buffer",
    "get_capabilities", "get_speculative_stats", "max_draft_tokens_per_proposal", "begin_turn", "begin_turn_first",
    "cancel_turn", "close", "rewind", "set_draft_tokens", "create_turn_options", "turn_options_set_max",
    "turn_options_set_min", "turn_options_reset", "turn_options_set_do_sample", "turn_options_set_temperature",
    "turn_options_set_top_p", "turn_options_set_top_k", "turn_options_set_repetition_penalty",
    "turn_options_set_no_repeat_ngram_size", "turn_options_set_seed", "turn_options_clear_seed",
    "turn_options_set_stop_strings", "turn_options_set_guidance", "turn_options_clear_guidance", "check_invariants",
]


@pytest.mark.parametrize("op", OP_NAMES)
def test_off_thread_operation_fails_and_changes_nothing(op):
    model, engine, buf, zero, done, live, fresh, opts = _setup()
    before = counters(engine)
    buf_len = len(buf)
    ops = _owner_ops(engine, buf, zero, done, live, fresh, opts)
    assert sorted(ops) == sorted(OP_NAMES)
    _, exc = on_thread(ops[op])
    assert isinstance(exc, RuntimeError), exc
    assert str(exc) == OWNER
    assert counters(engine) == before
    assert len(buf) == buf_len
    ogt.check_invariants(engine)
    # Everything still works on the owner thread, with exactly the streams of an untouched engine.
    events = drive(engine, buf)
    toks, reason = OracleSequence().turn([7, 7], max_gen=4)
    assert [key(e) for e in events] == expected_turn_events(1, 2, toks, reason)
    oracle = OracleSequence()
    oracle.turn([5, 9, 13], max_gen=2)
    assert done.begin_turn([4], opts) == 2  # the options still say 3
    events = drive(engine, buf)
    toks, reason = oracle.turn([4], max_gen=3)
    assert [key(e) for e in events] == expected_turn_events(2, 1, toks, reason)
    assert fresh.begin_turn([4], turn_options(fresh, max_gen=1)) == 1


def test_off_thread_engine_creation_makes_that_thread_the_owner(model):
    eng, exc = on_thread(lambda: og.Engine(model))
    assert exc is None
    with pytest.raises(RuntimeError) as info:
        eng.create_request()
    assert str(info.value) == OWNER
    with pytest.raises(RuntimeError) as info:
        eng.has_pending_requests()
    assert str(info.value) == OWNER


def test_request_options_have_no_owner():
    opts, exc = on_thread(og.RequestOptions)
    assert exc is None
    _, exc = on_thread(lambda: opts.set_max_session_tokens(9))
    assert exc is None
    _, engine = make_engine()
    r = engine.create_request(options=opts)
    r.begin_turn(list(range(2, 10)))
    events = drive(engine)
    toks, reason = OracleSequence(max_session=9).turn(list(range(2, 10)))
    assert [key(e) for e in events] == expected_turn_events(1, 8, toks, reason)


def test_event_getters_work_off_thread():
    _, engine = make_engine()
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    buf = engine.run(engine.create_event_buffer(4))
    got, exc = on_thread(lambda: (len(buf), buf[0].token, buf[0].request, buf[0].usage.generated_tokens))
    assert exc is None
    toks, _ = OracleSequence().turn([5, 9, 13], max_gen=1)
    assert got == (1, toks[0], r, 1)


def test_off_thread_final_release_only_publishes_abandonment():
    _, engine = make_engine(max_batch_size=1)
    holder = [engine.create_request()]
    holder[0].begin_turn([5, 9, 13], turn_options(holder[0], max_gen=2))
    drive(engine)
    assert counters(engine)["free_blocks"] == 127

    def release():
        r = holder.pop()
        assert sys.getrefcount(r) == 2  # the local and the getrefcount argument
        del r

    _, exc = on_thread(release)
    assert exc is None
    gc.collect()
    c = counters(engine)
    assert c["bound_requests"] == 1 and c["resident_requests"] == 1 and c["free_blocks"] == 127
    ogt.check_invariants(engine)
    # A new request cannot be admitted until the owner reclaims the abandoned resident; creating it is
    # itself a boundary, so after it the slot is free.
    nxt = engine.create_request()
    c = counters(engine)
    assert c["bound_requests"] == 1 and c["resident_requests"] == 0 and c["free_blocks"] == 128
    nxt.begin_turn([4, 4], turn_options(nxt, max_gen=2))
    events = drive(engine)
    toks, reason = OracleSequence().turn([4, 4], max_gen=2)
    assert [key(e) for e in events] == expected_turn_events(1, 2, toks, reason)


def test_off_thread_release_of_an_active_request():
    _, engine = make_engine()
    holder = [engine.create_request()]
    peer = engine.create_request()
    holder[0].begin_turn([5, 9, 13], turn_options(holder[0], max_gen=20))
    peer.begin_turn([7, 7], turn_options(peer, max_gen=5))
    buf = engine.create_event_buffer(8)
    engine.run(buf)
    _, exc = on_thread(lambda: holder.clear())
    assert exc is None
    assert counters(engine)["bound_requests"] == 2
    events = drive(engine, buf)
    assert all(e.request is peer for e in events)
    toks, reason = OracleSequence().turn([7, 7], max_gen=5)
    assert [key(e) for e in events] == expected_turn_events(1, 2, toks, reason)[1:]
    c = counters(engine)
    assert c["bound_requests"] == 1
    assert c["free_blocks"] == 128 - 2  # only the peer's 6 processed tokens


def test_many_threads_releasing_requests_concurrently():
    _, engine = make_engine(max_batch_size=8)
    reqs = [engine.create_request() for _ in range(8)]
    for i, r in enumerate(reqs):
        r.begin_turn([i + 2, 3], turn_options(r, max_gen=2))
    del r
    drive(engine)
    batches = [[reqs.pop()] for _ in range(8)]
    threads = [threading.Thread(target=b.clear) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not engine.has_pending_requests()
    c = counters(engine)
    assert c["bound_requests"] == 0 and c["free_blocks"] == 128
    ogt.check_invariants(engine)


def test_run_releases_the_gil():
    # A large vocabulary makes one step take tens of milliseconds. A worker thread stamps the time
    # every millisecond; each stamp needs the GIL, so stamps strictly inside a run's interval (with
    # margins for the switches around the call) prove that run released it.
    _, engine = make_engine(vocab_size=1 << 20, max_batch_size=16, max_scheduled_tokens=16)
    reqs = [engine.create_request() for _ in range(16)]
    for i, r in enumerate(reqs):
        r.begin_turn([i + 2, 5, 7], turn_options(r, max_gen=50))
    buf = engine.create_event_buffer(16)
    engine.run(buf)  # prefill
    stamps = []
    stop = threading.Event()

    def stamp():
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.001)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    t = threading.Thread(target=stamp)
    t.start()
    inside = 0
    total = 0.0
    try:
        time.sleep(0.005)
        for _ in range(3):
            t0 = time.perf_counter()
            engine.run(buf)
            t1 = time.perf_counter()
            total += t1 - t0
            inside += sum(1 for s in list(stamps) if t0 + 0.003 < s < t1 - 0.003)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert total > 0.03, "the steps are too short to observe GIL release"
    assert inside >= 5, f"only {inside} worker stamps fell inside {total * 1000:.0f} ms of run"


def test_dropping_the_engine_on_another_thread_tears_it_down():
    """The last reference to an engine released on another thread destroys it there (its executor
    closed, its requests tombstones that refuse every use clearly), and the model serves a new
    engine on the owner thread with an untouched engine's streams."""
    model, engine = make_engine()
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=4))
    engine.run(engine.create_event_buffer(8))
    box = [engine]
    del engine

    def drop():
        box.pop()
        gc.collect()

    _, exc = on_thread(drop)
    assert exc is None and box == []
    with pytest.raises(RuntimeError, match="Cannot use a closed request"):
        r.begin_turn([4], turn_options(r, max_gen=1))
    r.close()
    fresh = og.Engine(model)
    again = fresh.create_request()
    again.begin_turn([5, 9, 13], turn_options(again, max_gen=4))
    toks, reason = OracleSequence().turn([5, 9, 13], max_gen=4)
    assert [key(e) for e in drive(fresh, fresh.create_event_buffer(8))] == expected_turn_events(1, 3, toks, reason)

