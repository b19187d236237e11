"""Per-call costs of the Python binding (targets, asserted: run() with no work < 1 us, an event getter
< 100 ns, both beyond the baseline). `len(buffer)` is the baseline: one trivial C call through the
binding, measured in the same test, so the figures show what each call adds on top of crossing into
C at all."""
import timeit

import numpy as np

import oga
from oga import testing


def _baseline_ns(buffer):
    """The fastest of several timings of len(buffer), in ns per call."""
    return min(timeit.repeat(lambda: len(buffer), number=20000, repeat=7)) / 20000 * 1e9


def _added_ns(benchmark, buffer):
    """What the benchmarked call costs beyond the baseline (medians), in ns; recorded in extra_info."""
    added = benchmark.stats.stats.median * 1e9 - _baseline_ns(buffer)
    benchmark.extra_info["ns beyond len(buffer)"] = added
    print(f"\n{benchmark.name}: {added:.0f} ns beyond len(buffer)")
    return added


def test_baseline_buffer_len(benchmark, idle_engine):
    _, buffer = idle_engine
    benchmark(len, buffer)


def test_run_without_work(benchmark, idle_engine):
    engine, buffer = idle_engine
    result = benchmark(engine.run, buffer)
    assert result is buffer and len(buffer) == 0
    assert _added_ns(benchmark, buffer) < 1000


def test_has_pending_requests_idle(benchmark, idle_engine):
    engine, _ = idle_engine
    assert benchmark(engine.has_pending_requests) is False


def _one_event():
    engine = oga.Engine(testing.create_test_model())
    request = engine.create_request()
    request.begin_turn([5, 9, 13])
    buffer = engine.create_event_buffer(8)
    engine.run(buffer)
    assert len(buffer) == 1
    return engine, request, buffer, buffer[0]


def test_event_token_getter(benchmark):
    engine, request, buffer, event = _one_event()
    assert benchmark(getattr, event, "token") == 40  # the test model's first token after [5, 9, 13]
    assert _added_ns(benchmark, buffer) < 100


def test_event_flags_getter(benchmark):
    engine, request, buffer, event = _one_event()
    assert benchmark(getattr, event, "flags") & oga.EngineEventFlags.TOKEN
    assert _added_ns(benchmark, buffer) < 100


def test_event_request_getter(benchmark):
    engine, request, buffer, event = _one_event()
    assert benchmark(getattr, event, "request") is request
    assert _added_ns(benchmark, buffer) < 100


def test_buffer_index(benchmark):
    engine, request, buffer, event = _one_event()
    benchmark(buffer.__getitem__, 0)


def test_create_request(benchmark):
    engine = oga.Engine(testing.create_test_model())
    benchmark(engine.create_request)


def test_create_and_close_request(benchmark):
    """Goal (issue 15): <= 2 us for create + close. An unseeded request's seed basis comes from the
    engine's own sequence (one OS draw per engine); a random_device draw per request cost ~20 us."""
    engine = oga.Engine(testing.create_test_model())

    def create_and_close():
        engine.create_request().close()

    benchmark(create_and_close)
    median_us = benchmark.stats.stats.median * 1e6
    benchmark.extra_info["us per create + close"] = median_us
    print(f"\ncreate + close: {median_us:.2f} us")
    assert median_us <= 2.0


def test_begin_turn(benchmark):
    engine = oga.Engine(testing.create_test_model(max_batch_size=8))
    tokens = np.array([5, 9, 13, 17, 21, 25, 29, 33], dtype=np.int32)

    def fresh_request():
        return (engine.create_request(),), {}

    def begin(request):
        request.begin_turn(tokens)
        request.close()  # keep the engine's queue empty between rounds

    benchmark.pedantic(begin, setup=fresh_request, rounds=20000, iterations=1)
