"""Token selection shared among RowWorkers threads (vocabularies of 4096 tokens and more): every
row's result is independent of which thread selected it, so any thread count gives the same events,
including with stop strings, guidance and rolled-back steps."""
import os

import pytest

import oga as og
import oga.testing as ogt
from helpers import drive, key

VOCAB = 8192
ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def _table():
    return [ALPHABET[t % 26] * (1 + t % 3) if t > 1 else f"<s{t}>" for t in range(VOCAB)]


POLICIES = [
    {},
    {"do_sample": True, "temperature": 1.3, "top_k": 0, "top_p": 0.8, "seed": 11},
    {"do_sample": True, "temperature": 0.7, "top_k": 40, "seed": 12},
    {"do_sample": True, "top_k": 0, "top_p": 1.0, "seed": 13},
    {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
    {"do_sample": True, "top_k": 3000, "top_p": 0.6, "seed": 14},
]


def _run(threads, fault=None):
    previous = os.environ.get("OGA_SAMPLER_THREADS")
    os.environ["OGA_SAMPLER_THREADS"] = str(threads)
    try:
        model = ogt.create_test_model(vocab_size=VOCAB, max_batch_size=32, num_blocks=512, context_length=64)
        ogt.set_token_table(model, _table(), special=[0, 1])
        if fault is not None:
            ogt.inject_fault(model, **fault)
        engine = og.Engine(model)
    finally:
        if previous is None:
            del os.environ["OGA_SAMPLER_THREADS"]
        else:
            os.environ["OGA_SAMPLER_THREADS"] = previous
    requests = []
    for i in range(24):
        r = engine.create_request()
        t = og.TurnOptions(r)
        t.set_max_generated_tokens(12)
        for name, value in POLICIES[i % len(POLICIES)].items():
            getattr(t, "set_" + name)(value + i if name == "seed" else value)
        if i % 5 == 0:
            t.set_stop_strings(["cc", "zz"])
        if i % 7 == 3:
            t.set_guidance("regex", "(ab|c)+")
        r.begin_turn([2 + i, 3 + 2 * i, 4], t)
        requests.append(r)
    evs = drive(engine)
    return [[key(e) + (e.stop_index,) for e in evs if e.request is r] for r in requests], ogt.engine_counters(engine)


def test_any_thread_count_gives_the_same_events():
    serial, _ = _run(1)
    assert any(events[-1][3] == 2 for events in serial)  # some turns stopped on a stop string
    for threads in (2, 3, 8):
        parallel, _ = _run(threads)
        assert parallel == serial, threads


@pytest.mark.parametrize("fault", [dict(phase="execute", kind="retryable", skip=2, count=2),
                                   dict(phase="sample", skip=4, count=1)], ids=["execute", "sample"])
def test_parallel_selection_rolls_back_like_serial(fault):
    serial, _ = _run(1)
    parallel, counters = _run(4, fault)
    assert parallel == serial
    assert counters["rolled_back_steps"] == fault["count"]
