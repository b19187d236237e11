"""CUDA graph packing (seed "CUDA graph capture"): for an executor that captures
graphs, a pure-decode step is packed at a block-table bucket (a power of two of at least 8 columns,
capped at the configured maximum) with a graph id per (rows, bucket) and attention bounds valid for
every replay of that bucket; every other step runs eagerly (graph id -1, exact bounds). The test
executor declares the capability and fails any graph step a captured graph could not replay;
tokens must not change."""
import random

import pytest

import oga as og
import oga.testing as ogt
from helpers import Job, Turn, drive, expected_workload, prompt_without_eos, run_once, run_workload, turn_options


def graph_cfg(**cfg):
    cfg.setdefault("cuda_graph", True)
    return cfg


@pytest.mark.parametrize("seed", range(4))
def test_graph_steps_keep_every_stream(seed):
    rng = random.Random(seed)
    jobs = [Job([Turn([rng.randrange(2, 64) for _ in range(rng.randrange(1, 30))], max_gen=rng.randrange(1, 40))
                 for _ in range(rng.randrange(1, 3))], start_run=rng.randrange(0, 40)) for _ in range(8)]
    cfg = graph_cfg(max_batch_size=4, max_scheduled_tokens=rng.choice([8, 64]), context_length=256,
                    num_blocks=256)
    result = run_workload(cfg, jobs)
    assert result.per_job == expected_workload(jobs, cfg)


def decode_steps(engine, buffer, count):
    seen = []
    for _ in range(count):
        run_once(engine, buffer)
        seen.append(ogt.last_step_inputs(engine))
    return seen


def test_buckets_bounds_and_graph_ids():
    # block size 4, context 256: 64 columns at most; buckets 8, 16, 32, 64
    engine = og.Engine(ogt.create_test_model(**graph_cfg(context_length=256, num_blocks=256)))
    buffer = engine.create_event_buffer(16)
    request = engine.create_request()
    request.begin_turn(prompt_without_eos(3), turn_options(request, max_gen=0, min_gen=150))
    first = decode_steps(engine, buffer, 1)[0]
    assert first["graph_id"] == -1  # the prefill runs eagerly, exact bounds
    assert list(first["attention_metadata"]) == [3, 3, 3]
    steps = decode_steps(engine, buffer, 100)
    for s in steps:
        kv = int(s["past_sequence_lengths"][0]) + 1
        columns = s["block_table"].shape[1]
        blocks = (kv + 3) // 4
        expected_columns = max(8, 1 << (blocks - 1).bit_length())
        assert columns == expected_columns
        assert s["graph_id"] == {8: 0, 16: 1, 32: 2, 64: 3}[columns]  # one row: ids 0..3
        lower = 1 if columns == 8 else (columns // 2) * 4 + 1
        assert list(s["attention_metadata"]) == [1, columns * 4, lower]
        assert list(s["block_table"][0][blocks:]) == [-1] * (columns - blocks)


def test_graph_ids_depend_on_rows_and_bucket():
    engine = og.Engine(ogt.create_test_model(**graph_cfg(context_length=256, num_blocks=256, max_batch_size=4)))
    buffer = engine.create_event_buffer(16)
    requests = [engine.create_request() for _ in range(3)]
    for i, r in enumerate(requests):
        r.begin_turn(prompt_without_eos(3, offset=i), turn_options(r, min_gen=50, max_gen=60))
    run_once(engine, buffer)
    ids = {}
    for s in decode_steps(engine, buffer, 40):
        shape = (s["num_rows"], s["block_table"].shape[1])
        ids.setdefault(shape, set()).add(s["graph_id"])
    assert all(len(v) == 1 for v in ids.values())
    assert len({next(iter(v)) for v in ids.values()}) == len(ids)
    # 4 buckets per row count: 3 rows of bucket 8 is graph 2 * 4 + 0
    assert ids[(3, 8)] == {8}


def test_a_capped_final_bucket_and_a_sub_minimum_capacity():
    # context 40, block 4: at most 10 columns -> buckets 8 and 10 (lower bound 8 * 4 + 1)
    engine = og.Engine(ogt.create_test_model(**graph_cfg(context_length=40, num_blocks=64)))
    buffer = engine.create_event_buffer(16)
    request = engine.create_request()
    request.begin_turn([5, 6, 7], turn_options(request, min_gen=30, max_gen=36))
    run_once(engine, buffer)
    widths = set()
    for s in decode_steps(engine, buffer, 33):
        if s["num_rows"] == 0 or s["graph_id"] < 0:
            continue
        columns = s["block_table"].shape[1]
        widths.add(columns)
        kv = int(s["past_sequence_lengths"][0]) + 1
        assert list(s["attention_metadata"]) == [1, columns * 4, 1 if columns == 8 else 33]
        assert 1 <= kv <= columns * 4
    assert widths == {8, 10}
    # context 20: 5 columns at most -> one clamped bucket of 5, lower bound 1
    engine = og.Engine(ogt.create_test_model(**graph_cfg(context_length=20, num_blocks=64)))
    buffer = engine.create_event_buffer(16)
    request = engine.create_request()
    request.begin_turn([5, 6, 7], turn_options(request, min_gen=10, max_gen=12))
    run_once(engine, buffer)
    for s in decode_steps(engine, buffer, 5):
        assert s["block_table"].shape[1] == 5 and s["graph_id"] == 0
        assert list(s["attention_metadata"]) == [1, 20, 1]


def test_mixed_and_draft_steps_run_eagerly_and_hybrid_models_never_capture():
    engine = og.Engine(ogt.create_test_model(**graph_cfg(per_token_logits=True)))
    buffer = engine.create_event_buffer(16)
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn(prompt_without_eos(12), turn_options(a, max_gen=12))
    run_once(engine, buffer)
    b.begin_turn([5, 6, 7, 8], turn_options(b, max_gen=2))
    run_once(engine, buffer)  # a's decode beside b's prefill
    assert ogt.last_step_inputs(engine)["graph_id"] == -1
    drive(engine, buffer)
    hybrid = og.Engine(ogt.create_test_model(**graph_cfg(hybrid=([1], [0], []))))
    request = hybrid.create_request()
    request.begin_turn([5, 6, 7], turn_options(request, max_gen=6))
    buffer = hybrid.create_event_buffer(16)
    for _ in range(4):
        run_once(hybrid, buffer)
        assert ogt.last_step_inputs(hybrid)["graph_id"] == -1


def test_without_the_capability_every_step_is_eager():
    engine = og.Engine(ogt.create_test_model())
    request = engine.create_request()
    request.begin_turn([5, 6, 7], turn_options(request, max_gen=5))
    buffer = engine.create_event_buffer(16)
    run_once(engine, buffer)
    run_once(engine, buffer)
    s = ogt.last_step_inputs(engine)
    assert s["graph_eligible"] and s["graph_id"] == -1 and s["block_table"].shape[1] == 1


def test_graph_buckets_stop_at_the_executors_widest_block_table():
    """Found in review: a graph bucket must not be wider than the table the executor takes."""
    engine = og.Engine(ogt.create_test_model(**graph_cfg(context_length=128, max_block_table_columns=10)))
    buffer = engine.create_event_buffer(64)
    request = engine.create_request()
    request.begin_turn([2 + (3 * i) % 60 for i in range(33)], turn_options(request, max_gen=4))
    widths = []
    while engine.has_pending_requests():
        run_once(engine, buffer)
        s = ogt.last_step_inputs(engine)
        widths.append((s["graph_id"], s["block_table"].shape[1]))
    assert any(g >= 0 for g, _ in widths), widths
    assert all(w <= 10 for _, w in widths), widths
    assert (1, 10) in widths  # the capped final bucket
