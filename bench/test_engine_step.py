"""Engine time per decode step with 64 resident requests (target < 20 us).

The engine counts the wall time of every dynamic transaction and, separately, the time spent
inside the model executor; their difference is the engine's own cost per step (planning,
reservation, packing, selection, commit, events). The test executor computes 64 x 64 logits per
step, which is why it is measured and subtracted rather than assumed free."""
from oga import testing

from conftest import decode_workload

STEPS = 2000


def test_decode_step_64_requests(benchmark):
    engine, requests, buffer = decode_workload(64)
    before = testing.engine_counters(engine)

    def step():
        engine.run(buffer)

    benchmark.pedantic(step, rounds=STEPS, iterations=1, warmup_rounds=0)
    after = testing.engine_counters(engine)
    steps = after["committed_steps"] - before["committed_steps"]
    assert steps == STEPS and len(buffer) == 64
    engine_ns = (after["step_ns"] - before["step_ns"]) - (after["executor_ns"] - before["executor_ns"])
    executor_ns = after["executor_ns"] - before["executor_ns"]
    benchmark.extra_info["engine_us_per_step"] = engine_ns / steps / 1000.0
    benchmark.extra_info["executor_us_per_step"] = executor_ns / steps / 1000.0
    print(f"\nengine time per 64-request decode step: {engine_ns / steps / 1000.0:.2f} us "
          f"(executor {executor_ns / steps / 1000.0:.2f} us)")
    testing.check_invariants(engine)
    assert engine_ns / steps / 1000.0 < 20.0


def test_decode_step_64_requests_with_event_reads(benchmark):
    """The same step as a serving loop sees it: run() plus reading every event's request and token."""
    engine, requests, buffer = decode_workload(64)

    def step_and_read():
        for event in engine.run(buffer):
            event.request
            event.token

    benchmark.pedantic(step_and_read, rounds=STEPS, iterations=1, warmup_rounds=0)
