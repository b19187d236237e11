"""Packed step inputs (VarlenDecoderIO layout) as the executor receives them."""

import numpy as np
import pytest

import oga.testing as ogt
from helpers import OracleSequence, drive, make_engine, prompt_without_eos, run_once, turn_options


def ceil_div(a, b):
    return -(-a // b)


def step(engine):
    return ogt.last_step_inputs(engine)


def check_consistency(d, block_size, num_blocks):
    """Properties every packed step must satisfy."""
    rows, n = d["num_rows"], d["num_tokens"]
    cum = d["cumulative_sequence_lengths"].tolist()
    past = d["past_sequence_lengths"].tolist()
    q = [cum[i + 1] - cum[i] for i in range(rows)]
    assert cum[0] == 0 and cum[-1] == n and len(cum) == rows + 1
    assert all(x >= 1 for x in q)
    assert len(d["input_ids"]) == n
    assert d["position_ids"].tolist() == [past[r] + j for r in range(rows) for j in range(q[r])]
    assert d["logits_indices"].tolist() == [cum[r + 1] - 1 for r in range(rows)]
    bt = d["block_table"]
    assert bt.ndim == 2 and bt.shape[0] == rows
    used = []
    widest = 0
    for r in range(rows):
        need = ceil_div(past[r] + q[r], block_size)
        row = bt[r].tolist()
        valid = [b for b in row if b != -1]
        assert row == valid + [-1] * (len(row) - len(valid)), f"padding must be trailing -1: {row}"
        assert len(valid) >= need, row
        assert all(0 <= b < num_blocks for b in valid), row
        used += valid
        widest = max(widest, len(valid))
    assert len(used) == len(set(used)), "a block appears in two rows or twice in one row"
    graph = all(x == 1 for x in q) and d["graph_eligible"]
    md = d["attention_metadata"].tolist()
    max_kv = max(p + x for p, x in zip(past, q))
    if d["graph_eligible"]:
        assert all(x == 1 for x in q)
        assert md[0] == 1 and md[1] >= max_kv and 1 <= md[2] <= max_kv
    else:
        assert md == [max(q), max_kv, max_kv]
        assert bt.shape[1] == widest, "eager width = widest row"
    return graph


def test_nothing_before_the_first_step(engine):
    d = step(engine)
    assert d["num_rows"] == 0


def test_dtypes(engine):
    r = engine.create_request()
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=1))
    drive(engine)
    d = step(engine)
    for name, dtype in (("input_ids", np.int64), ("position_ids", np.int64),
                        ("cumulative_sequence_lengths", np.int32), ("past_sequence_lengths", np.int32),
                        ("block_table", np.int32), ("attention_metadata", np.int32), ("logits_indices", np.int32)):
        assert d[name].dtype == dtype, name
    assert isinstance(d["graph_eligible"], bool)


def test_prefill_then_pure_decode():
    _, engine = make_engine()
    prompts = [[5, 9, 13], [7], [20, 21]]
    oracles = [OracleSequence() for _ in prompts]
    outs = [o.turn(p, stop_after=2)[0] for o, p in zip(oracles, prompts)]
    assert all(len(o) == 2 for o in outs)
    reqs = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=2))
        reqs.append(r)
    buf = engine.create_event_buffer(8)
    run_once(engine, buf)
    d = step(engine)
    assert d["num_rows"] == 3 and d["num_tokens"] == 6
    assert d["input_ids"].tolist() == [5, 9, 13, 7, 20, 21]
    assert d["cumulative_sequence_lengths"].tolist() == [0, 3, 4, 6]
    assert d["past_sequence_lengths"].tolist() == [0, 0, 0]
    assert d["position_ids"].tolist() == [0, 1, 2, 0, 0, 1]
    assert d["logits_indices"].tolist() == [2, 3, 5]
    assert d["attention_metadata"].tolist() == [3, 3, 3]
    assert d["graph_eligible"] is False
    assert d["block_table"].shape == (3, 1)
    first_blocks = d["block_table"][:, 0].tolist()
    assert len(set(first_blocks)) == 3
    check_consistency(d, 4, 128)
    run_once(engine, buf)
    d = step(engine)
    assert d["input_ids"].tolist() == [o[0] for o in outs]
    assert d["cumulative_sequence_lengths"].tolist() == [0, 1, 2, 3]
    assert d["past_sequence_lengths"].tolist() == [3, 1, 2]
    assert d["position_ids"].tolist() == [3, 1, 2]
    assert d["logits_indices"].tolist() == [0, 1, 2]
    assert d["graph_eligible"] is True
    assert d["block_table"][:, 0].tolist() == first_blocks  # blocks are stable across steps
    check_consistency(d, 4, 128)


def test_block_table_padding():
    _, engine = make_engine()
    a, b = engine.create_request(), engine.create_request()
    a.begin_turn(list(range(10, 19)), turn_options(a, max_gen=1))
    b.begin_turn([7], turn_options(b, max_gen=1))
    engine.run(engine.create_event_buffer(4))
    d = step(engine)
    bt = d["block_table"]
    assert bt.shape == (2, 3)
    assert bt[1, 1:].tolist() == [-1, -1]
    assert all(x >= 0 for x in bt[0].tolist()) and bt[1, 0] >= 0
    assert len({*bt[0].tolist(), bt[1, 0]}) == 4
    check_consistency(d, 4, 128)


@pytest.mark.parametrize("block_size", [1, 3, 4])
def test_block_rows_grow_by_appending(block_size):
    _, engine = make_engine(block_size=block_size)
    r = engine.create_request()
    prompt = prompt_without_eos(12)
    r.begin_turn(prompt, turn_options(r, max_gen=12))
    buf = engine.create_event_buffer(4)
    prev = []
    while engine.has_pending_requests():
        run_once(engine, buf)
        d = step(engine)
        check_consistency(d, block_size, 128)
        row = [b for b in d["block_table"][0].tolist() if b >= 0]
        assert row[:len(prev)] == prev
        prev = row
    assert len(prev) == ceil_div(3 + 11, block_size)


def test_chunked_prefill_metadata():
    _, engine = make_engine(chunk_size=4)
    prompt = list(range(10, 20))
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=1))
    buf = engine.create_event_buffer(4)
    expected = [(prompt[0:4], 0, [4, 4, 4]), (prompt[4:8], 4, [4, 8, 8]), (prompt[8:10], 8, [2, 10, 10])]
    for ids, past, md in expected:
        run_once(engine, buf)
        d = step(engine)
        assert d["input_ids"].tolist() == ids
        assert d["past_sequence_lengths"].tolist() == [past]
        assert d["attention_metadata"].tolist() == md
        assert d["graph_eligible"] is False
        check_consistency(d, 4, 128)
        # The whole prompt's blocks are visible from the first chunk on.
        assert d["block_table"].shape[1] >= ceil_div(past + len(ids), 4)


def test_mixed_step_metadata_and_offsets():
    _, engine = make_engine()
    a = engine.create_request()
    pa = prompt_without_eos(3, length=6)
    a.begin_turn(pa, turn_options(a, max_gen=3))
    buf = engine.create_event_buffer(8)
    run_once(engine, buf)
    b = engine.create_request()
    b.begin_turn([7, 8, 9, 10, 11], turn_options(b, max_gen=1))
    run_once(engine, buf)
    d = step(engine)
    ta, _ = OracleSequence().turn(pa, stop_after=1)
    assert d["input_ids"].tolist() == [ta[0], 7, 8, 9, 10, 11]
    assert d["cumulative_sequence_lengths"].tolist() == [0, 1, 6]
    assert d["past_sequence_lengths"].tolist() == [6, 0]
    assert d["position_ids"].tolist() == [6, 0, 1, 2, 3, 4]
    assert d["logits_indices"].tolist() == [0, 5]
    assert d["attention_metadata"].tolist() == [5, 7, 7]
    assert d["graph_eligible"] is False
    check_consistency(d, 4, 128)


def test_continuation_replays_the_last_generated_token():
    _, engine = make_engine()
    prompt = prompt_without_eos(2)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=2))
    drive(engine)
    toks, _ = OracleSequence().turn(prompt, max_gen=2)
    r.begin_turn([8, 9], turn_options(r, max_gen=1))
    engine.run(engine.create_event_buffer(4))
    d = step(engine)
    # The turn ended on a sampled token that was never in KV: it leads the continuation prefill.
    assert d["input_ids"].tolist() == [toks[1], 8, 9]
    assert d["past_sequence_lengths"].tolist() == [4]
    assert d["position_ids"].tolist() == [4, 5, 6]
    check_consistency(d, 4, 128)


def test_continuation_after_eos_has_no_replayed_token():
    from helpers import R_EOS, find_prompt

    prompt = find_prompt(lambda p: (lambda t: t[1] == R_EOS and len(t[0]) >= 1)(OracleSequence().turn(p)), length=2)
    toks, _ = OracleSequence().turn(prompt)
    _, engine = make_engine()
    r = engine.create_request()
    r.begin_turn(prompt)
    drive(engine)
    r.begin_turn([8, 9], turn_options(r, max_gen=1))
    engine.run(engine.create_event_buffer(4))
    d = step(engine)
    assert d["input_ids"].tolist() == [8, 9]
    n = len(prompt) + len(toks)
    assert d["past_sequence_lengths"].tolist() == [n]
    check_consistency(d, 4, 128)


def test_every_step_of_a_busy_workload_is_consistent():
    cfg = dict(block_size=2, num_blocks=200, max_scheduled_tokens=9, chunk_size=4, max_batch_size=5)
    _, engine = make_engine(**cfg)
    prompts = [list(range(2, 2 + n)) for n in (1, 5, 11, 3, 8, 2, 14)]
    live = {}
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=6))
        live[r] = p
    buf = engine.create_event_buffer(3)
    seen_graph = seen_mixed = False
    steps = 0
    last_runs = 0
    while engine.has_pending_requests():
        finished = [e.request for e in run_once(engine, buf) if e.flags & 2]
        for r in finished:
            r.close()
            del live[r]
        del finished
        runs = ogt.engine_counters(engine)["model_runs"]
        if runs != last_runs:
            d = step(engine)
            assert d["num_tokens"] <= 9 and d["num_rows"] <= 5
            g = check_consistency(d, 2, 200)
            seen_graph |= g
            q = np.diff(d["cumulative_sequence_lengths"])
            seen_mixed |= bool((q == 1).any() and (q > 1).any())
            steps += 1
        last_runs = runs
    assert not live
    assert seen_graph and seen_mixed and steps > 10
