"""Prefix caching (engine.dynamic_batching.prefix_caching; docs/onnxruntime-genai-0.18-dynamic-engine.md,
"Prefix caching"). The test executor reads
every position's state back through the block tables (tests/helpers.py oracle), so a shared block
holding the wrong tokens, or one written while shared, changes the tokens."""
import random

import pytest

import oga as og
import oga.testing as ogt
from helpers import OracleSequence, drive, key, turn_options

BLOCK = 4


def engine_with(prefix_caching=True, **cfg):
    cfg.setdefault("block_size", BLOCK)
    cfg.setdefault("num_blocks", 96)
    model = ogt.create_test_model(prefix_caching=prefix_caching, **cfg)
    return model, og.Engine(model)


def run(engine, prompts, max_gen=6, close=True):
    """Submits every prompt at once; returns (tokens, usage) per prompt."""
    requests = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=max_gen))
        requests.append(r)
    evs = drive(engine)
    out = []
    for r in requests:
        mine = [e for e in evs if e.request is r]
        out.append(([e.token for e in mine if e.flags & 1], mine[-1].usage))
        if close:
            r.close()
    return out


def expected(prompt, max_gen=6):
    return OracleSequence().turn(prompt, max_gen=max_gen)[0]


SYSTEM = list(range(2, 30))  # 28 tokens: 7 full blocks


def test_shared_prefix_workload_gives_the_same_tokens_with_and_without_caching():
    rng = random.Random(11)
    waves = [[SYSTEM[:rng.randrange(9, 29)] + [rng.randrange(2, 64) for _ in range(rng.randrange(1, 6))]
              for _ in range(6)] for _ in range(5)]
    results = {}
    for caching in (False, True):
        _, engine = engine_with(caching)
        results[caching] = [run(engine, wave) for wave in waves]
    for wave, off, on in zip(waves, results[False], results[True]):
        for prompt, (tokens_off, usage_off), (tokens_on, _) in zip(wave, off, on):
            assert tokens_off == tokens_on == expected(prompt)
            assert usage_off[2] == 0
    cached = [usage[2] for wave in results[True][1:] for _, usage in wave]
    assert sum(cached) > 0


@pytest.mark.parametrize("length", [4, 5, 8, 9, 12, 13])
def test_cached_prompt_tokens_count_full_blocks_and_leave_one_token(length):
    _, engine = engine_with()
    prompt = SYSTEM[:length]
    run(engine, [prompt])
    ((tokens, usage),) = run(engine, [prompt])
    assert tokens == expected(prompt)
    assert (usage[0], usage[2]) == (length, ((length - 1) // BLOCK) * BLOCK)  # at least one prompt token executes


def test_prompts_submitted_together_wait_for_the_shared_blocks_and_adopt_them():
    # Three requests with the same 14-token prompt (3 full blocks adoptable) submitted at once: the
    # first computes the blocks, the others are admitted once they are indexed and adopt them.
    _, engine = engine_with()
    prompt = SYSTEM[:14]
    results = run(engine, [prompt, prompt, prompt + [40, 41]], close=False)
    assert [tokens for tokens, _ in results] == [expected(prompt), expected(prompt), expected(prompt + [40, 41])]
    assert [usage[2] for _, usage in results] == [0, 12, 12]
    ogt.check_invariants(engine)
    ((tokens, usage),) = run(engine, [prompt])
    assert tokens == expected(prompt) and usage[2] == 12


def test_waiting_for_shared_blocks_does_not_hold_back_other_prompts():
    _, engine = engine_with(max_scheduled_tokens=4)
    shared = SYSTEM[:20]
    other = [40 + i % 20 for i in range(10)]
    r1 = engine.create_request()
    r1.begin_turn(shared + [50], turn_options(r1, max_gen=3))
    r2 = engine.create_request()
    r2.begin_turn(shared + [51], turn_options(r2, max_gen=3))  # waits for r1's blocks
    r3 = engine.create_request()
    r3.begin_turn(other, turn_options(r3, max_gen=3))  # unrelated: admitted at once
    buffer = engine.create_event_buffer(16)
    engine.run(buffer)
    assert ogt.engine_counters(engine)["resident_requests"] == 2 and ogt.engine_counters(engine)["waiting_requests"] == 1
    evs = drive(engine, buffer)
    assert [e.token for e in evs if e.request is r2 and e.flags & 1] == expected(shared + [51], 3)
    assert [e for e in evs if e.request is r2][-1].usage[2] == 20


def test_eviction_under_pressure_is_least_recently_released_first():
    # 8 blocks. Each 12-token prompt with 2 generated tokens owns 4 blocks and indexes its 3 prompt
    # blocks; closed, those stay adoptable (evictable) and the fourth is free.
    _, engine = engine_with(num_blocks=8, context_length=40)
    a, b, c = SYSTEM[:12], [40 + i for i in range(12)], [50 + i % 10 for i in range(12)]
    for prompt in (a, b, c):
        ((tokens, _),) = run(engine, [prompt], max_gen=2)
        assert tokens == expected(prompt, 2)
    # c needed 4 blocks with 2 free: the two least recently released were evicted -- a's last two
    # (a table is released from its end), so a's first block is still there.
    ((tokens, usage),) = run(engine, [a], max_gen=2)
    assert tokens == expected(a, 2) and usage[2] == 4
    ((tokens, usage),) = run(engine, [c], max_gen=2)
    assert tokens == expected(c, 2) and usage[2] == 8
    ogt.check_invariants(engine)


def test_shared_blocks_survive_their_first_owner():
    _, engine = engine_with()
    prompt = SYSTEM[:20]
    r1 = engine.create_request()
    r1.begin_turn(prompt, turn_options(r1, max_gen=2))
    drive(engine)
    r2 = engine.create_request()
    r2.begin_turn(prompt + [33], turn_options(r2, max_gen=3))
    buffer = engine.create_event_buffer(16)
    engine.run(buffer)  # r2 admitted on r1's blocks
    r1.close()  # the shared blocks stay: r2 holds them
    ogt.check_invariants(engine)
    drive(engine, buffer)
    r3 = engine.create_request()
    r3.begin_turn(prompt + [33], turn_options(r3, max_gen=3))
    evs = drive(engine)
    assert [e.token for e in evs if e.flags & 1] == expected(prompt + [33], 3)


@pytest.mark.parametrize("fault", [dict(phase="execute", kind="retryable"), dict(phase="execute", kind="capacity"),
                                   dict(phase="sample")], ids=["execute", "capacity", "sample"])
def test_rollback_undoes_adoption(fault):
    prompts = [SYSTEM[:18] + [40], SYSTEM[:18] + [41], SYSTEM[:10] + [42, 43]]
    _, clean = engine_with()
    run(clean, [SYSTEM[:20]])
    want = run(clean, prompts)
    model, engine = engine_with()
    run(engine, [SYSTEM[:20]])
    ogt.inject_fault(model, count=2, **fault)
    got = run(engine, prompts)
    assert got == want
    assert ogt.engine_counters(engine)["rolled_back_steps"] == 2


def test_cancel_close_and_abandon_adopting_requests():
    _, engine = engine_with()
    run(engine, [SYSTEM[:24]])
    r1 = engine.create_request()
    r1.begin_turn(SYSTEM[:24] + [50], turn_options(r1, max_gen=8))
    r2 = engine.create_request()
    r2.begin_turn(SYSTEM[:24] + [51], turn_options(r2, max_gen=8))
    r3 = engine.create_request()
    r3.begin_turn(SYSTEM[:24] + [52], turn_options(r3, max_gen=8))
    buffer = engine.create_event_buffer(32)
    engine.run(buffer)  # all three admitted on the cached blocks
    ogt.check_invariants(engine)
    assert r1.cancel_turn(1)
    r2.close()
    del r3  # abandoned: reclaimed at the next owner-thread boundary
    drive(engine, buffer)
    ogt.check_invariants(engine)
    ((tokens, usage),) = run(engine, [SYSTEM[:24] + [53]])
    assert tokens == expected(SYSTEM[:24] + [53]) and usage[2] == 24


def test_a_rewound_request_readopts_its_kept_history():
    # A rewind gives the request's blocks back (as 0.18 does); its next turn is admitted like a first
    # turn and adopts the indexed blocks of the history it kept, counting only its own input.
    _, engine = engine_with()
    r = engine.create_request()
    drive_turn(engine, r, SYSTEM[:13], 3)
    drive_turn(engine, r, SYSTEM[13:22], 2)
    r.rewind_to_start_of_turn(2)  # keeps SYSTEM[:13] and turn 1's 3 generated tokens: 16 tokens
    ogt.check_invariants(engine)
    evs = drive_turn(engine, r, SYSTEM[13:20] + [61], 4)  # 24 tokens; blocks 0..4 match the old history
    seq = OracleSequence()
    seq.turn(SYSTEM[:13], max_gen=3)
    assert [e.token for e in evs if e.flags & 1] == seq.turn(SYSTEM[13:20] + [61], max_gen=4)[0]
    assert evs[-1].usage[2] == 20 - 16  # 20 tokens adopted, 16 of them the kept history


def drive_turn(engine, request, prompt, max_gen):
    request.begin_turn(prompt, turn_options(request, max_gen=max_gen))
    return drive(engine)


def test_generated_tokens_of_a_conversation_are_reused_by_a_request_replaying_it():
    _, engine = engine_with()
    r = engine.create_request()
    evs = drive_turn(engine, r, SYSTEM[:9], 12)
    history = SYSTEM[:9] + [e.token for e in evs if e.flags & 1]
    ((tokens, usage),) = run(engine, [history + [44]])
    assert tokens == expected(history + [44])
    assert usage[2] >= 16  # blocks filled with generated tokens were indexed too


def test_continuation_turns_do_not_adopt():
    _, engine = engine_with()
    run(engine, [SYSTEM[:20]])
    r = engine.create_request()
    drive_turn(engine, r, [5], 2)
    evs = drive_turn(engine, r, SYSTEM[:20], 2)
    assert evs[-1].usage[2] == 0


def test_prefix_caching_is_on_unless_the_config_says_false():
    _, engine = engine_with(prefix_caching=None)  # no key: on, as in 0.18
    run(engine, [SYSTEM[:20]])
    ((_, usage),) = run(engine, [SYSTEM[:20]])
    assert usage[2] == 16


def test_prefix_caching_off_reports_no_cached_tokens():
    _, engine = engine_with(prefix_caching=False)
    run(engine, [SYSTEM[:20]])
    ((_, usage),) = run(engine, [SYSTEM[:20]])
    assert usage[2] == 0
