"""Caller-supplied speculative drafts (seed "Caller-supplied speculative drafts"):
greedy verification of a proposal with the per-token logits of one model run. The test executor's
greedy oracle (tests/helpers.py) says what plain decoding gives; drafts must never change it."""
import random

import pytest

import oga as og
import oga.testing as ogt
from helpers import R_EOS, R_MAX_GEN, R_MAX_SESSION, R_STOP, OracleSequence, drive, key, turn_options

TOKEN, FINISHED = 1, 2


def draft_engine(**cfg):
    cfg.setdefault("per_token_logits", True)
    model = ogt.create_test_model(**cfg)
    return model, og.Engine(model)


def decode_ready(engine, request, prompt, max_gen=0, **setters):
    """Begins a turn and runs its prefill; returns the first token's events."""
    t = turn_options(request, max_gen=max_gen)
    for name, value in setters.items():
        getattr(t, "set_" + name)(*(value if isinstance(value, tuple) else (value,)))
    request.begin_turn(prompt, t)
    buffer = engine.create_event_buffer(64)
    return [e for e in engine.run(buffer)], buffer


def run_with_drafts(engine, requests, propose, capacity=64, max_runs=500):
    """Runs until idle; before every run, propose(request, emitted_so_far) gives each decode-ready
    request its drafts. Returns (tokens per request, terminal (reason, stop index) per request,
    model runs)."""
    buffer = engine.create_event_buffer(capacity)
    tokens = {id(r): [] for r in requests}
    ends = {}
    ready = set()
    runs = 0
    start_runs = ogt.engine_counters(engine)["model_runs"]
    while engine.has_pending_requests():
        for r in requests:
            if id(r) in ready and id(r) not in ends:
                drafts = propose(r, tokens[id(r)])
                if drafts is not None:
                    r.set_draft_tokens(drafts)
        for e in engine.run(buffer):
            if e.request is None:
                continue
            if e.flags & TOKEN:
                tokens[id(e.request)].append(e.token)
                ready.add(id(e.request))
            if e.flags & FINISHED:
                ends[id(e.request)] = (int(e.finish_reason), e.matched_stop_string_index)
        ogt.check_invariants(engine)
        runs += 1
        assert runs < max_runs
    return ([tokens[id(r)] for r in requests], [ends.get(id(r)) for r in requests],
            ogt.engine_counters(engine)["model_runs"] - start_runs)


def oracle(prompt, max_gen=0, max_session=128):
    return OracleSequence(max_session=max_session).turn(prompt, max_gen=max_gen)


def correct_drafts(expected, k):
    return lambda r, emitted: expected[len(emitted):len(emitted) + k]


@pytest.mark.parametrize("k", [1, 3, 7])
def test_correct_drafts_equal_greedy_with_fewer_model_runs(k):
    prompt = [5, 9, 13]
    expected, reason = oracle(prompt, max_gen=40)
    _, engine = draft_engine()
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=40))
    (tokens,), (end,), runs = run_with_drafts(engine, [r], correct_drafts(expected, k))
    assert tokens == expected and end[0] == reason
    assert runs <= 1 + -(-(len(expected) - 1) // (k + 1)) + 1  # prefill, then k + 1 tokens per run
    stats = engine.get_speculative_stats()
    assert stats["draft_tokens_accepted"] == stats["draft_tokens_evaluated"] > 0
    assert stats["acceptance_rate"] == 1.0 and stats["zero_accept_rounds"] == 0


def test_wrong_drafts_still_equal_greedy():
    prompt = [6, 10, 14]
    expected, reason = oracle(prompt, max_gen=30)
    rng = random.Random(3)
    _, engine = draft_engine()
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=30))

    def propose(request, emitted):
        truth = expected[len(emitted):len(emitted) + 5]
        # keep a random prefix, then wrong tokens
        keep = rng.randrange(len(truth) + 1) if truth else 0
        return truth[:keep] + [(t + 1) % 64 for t in truth[keep:]]

    (tokens,), (end,), _ = run_with_drafts(engine, [r], propose)
    assert tokens == expected and end[0] == reason
    stats = engine.get_speculative_stats()
    assert stats["correction_tokens"] > 0 and stats["partial_accept_rounds"] + stats["zero_accept_rounds"] > 0
    assert sum(stats["acceptance_length_histogram"]) == stats["rounds"]


def test_mixed_batches_of_drafting_and_plain_requests():
    prompts = [[5 + i, 9, 13 + i] for i in range(6)]
    expected = [oracle(p, max_gen=25) for p in prompts]
    _, engine = draft_engine(max_batch_size=8)
    requests = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=25))
        requests.append(r)
    rng = random.Random(7)

    def propose(request, emitted):
        i = requests.index(request)
        if i % 2:
            return None  # odd requests never draft
        truth = expected[i][0][len(emitted):len(emitted) + 4]
        return truth if rng.random() < 0.6 else [(t + 3) % 64 for t in truth]

    tokens, ends, _ = run_with_drafts(engine, requests, propose)
    for i, (exp, reason) in enumerate(expected):
        assert tokens[i] == exp and ends[i][0] == reason, i


def test_budget_shortens_drafts_but_never_drops_a_mandatory_decode():
    # max_scheduled_tokens 6 and four decoding requests: mandatory tokens take 4, drafts share 2.
    prompts = [[5 + i, 9, 13] for i in range(4)]
    expected = [oracle(p, max_gen=20) for p in prompts]
    _, engine = draft_engine(max_scheduled_tokens=6, max_batch_size=4)
    requests = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=20))
        requests.append(r)

    def propose(request, emitted):
        i = requests.index(request)
        return expected[i][0][len(emitted):len(emitted) + 5]

    tokens, ends, _ = run_with_drafts(engine, requests, propose)
    for i, (exp, reason) in enumerate(expected):
        assert tokens[i] == exp and ends[i][0] == reason
    inputs = ogt.last_step_inputs(engine)
    assert inputs["num_tokens"] <= 6


def test_block_pressure_shortens_drafts():
    # 3 blocks of 4 slots: a draft may only use slots the pool still has.
    prompt = [5, 9, 13]
    expected, _ = oracle(prompt, max_gen=9, max_session=12)
    _, engine = draft_engine(num_blocks=3, block_size=4, context_length=12)
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=9))
    (tokens,), (end,), _ = run_with_drafts(engine, [r], correct_drafts(expected, 7))
    assert tokens == expected


def test_verification_ends_the_turn_inside_the_accepted_drafts():
    prompt = [5, 9, 13]
    expected, _ = oracle(prompt, max_gen=40)
    # max_generated_tokens lands inside a proposal: the turn ends there, later drafts are discarded.
    _, engine = draft_engine()
    r = engine.create_request()
    r.begin_turn(prompt, turn_options(r, max_gen=5))
    (tokens,), (end,), runs = run_with_drafts(engine, [r], correct_drafts(expected, 7))
    assert tokens == expected[:5] and end == (R_MAX_GEN, None)
    assert runs == 2  # prefill, then 4 tokens from one verification
    # The turn's last token stays unprocessed, as after plain decoding: a continuation works.
    ogt.check_invariants(engine)
    r.begin_turn([7], turn_options(r, max_gen=3))
    evs = drive(engine)
    seq = OracleSequence()
    seq.turn(prompt, max_gen=5)
    assert [e.token for e in evs] == seq.turn([7], max_gen=3)[0]


def test_an_accepted_eos_ends_the_turn_in_the_last_token_event():
    # A prompt whose greedy continuation ends with EOS after a few tokens.
    prompt = next(p for p in ([a, b, 13] for a in range(2, 64) for b in range(2, 64))
                  if 2 <= len(oracle(p, max_gen=6)[0]) <= 4 and oracle(p, max_gen=6)[1] == R_EOS)
    expected, _ = oracle(prompt, max_gen=6)
    _, engine = draft_engine()
    r = engine.create_request()
    _, buffer = decode_ready(engine, r, prompt, max_gen=6)
    r.set_draft_tokens(expected[1:] + [1])  # the rest, then EOS (id 1)
    evs = list(engine.run(buffer))
    assert [e.token for e in evs] == expected[1:]
    assert [int(e.flags) for e in evs] == [TOKEN] * (len(evs) - 1) + [TOKEN | FINISHED]
    assert int(evs[-1].finish_reason) == R_EOS
    assert evs[-1].usage.generated_tokens == len(expected)


def test_stop_string_truncates_the_verified_tokens():
    prompt = [5, 9, 13]
    expected, _ = oracle(prompt, max_gen=30)
    model, engine = draft_engine()
    ogt.set_token_table(model, [f"<{t}>" for t in range(64)], special=[0, 1])
    stop = f"<{expected[3]}>"
    at = expected.index(expected[3])
    r = engine.create_request()
    t = turn_options(r, max_gen=30)
    t.set_stop_strings([stop])
    r.begin_turn(prompt, t)
    (tokens,), (end,), _ = run_with_drafts(engine, [r], correct_drafts(expected, 7))
    assert tokens == expected[:at + 1] and end == (R_STOP, 0)


def test_session_limit_inside_the_drafts():
    prompt = [5, 9, 13]
    expected, reason = oracle(prompt, max_session=10)
    _, engine = draft_engine()
    options = og.RequestOptions()
    options.set_max_session_tokens(10)
    r = engine.create_request(options=options)
    r.begin_turn(prompt)
    (tokens,), (end,), _ = run_with_drafts(engine, [r], correct_drafts(expected, 7))
    assert tokens == expected and end[0] == reason == R_MAX_SESSION


def test_overflowing_events_are_retained_and_drained_before_the_next_run():
    prompt = [5, 9, 13]
    expected, _ = oracle(prompt, max_gen=20)
    _, engine = draft_engine()
    r = engine.create_request()
    _, _ = decode_ready(engine, r, prompt, max_gen=20)
    r.set_draft_tokens(expected[1:8])
    small = engine.create_event_buffer(3)
    runs = ogt.engine_counters(engine)["model_runs"]
    got = [e.token for e in engine.run(small)]
    got += [e.token for e in engine.run(small)]
    got += [e.token for e in engine.run(small)]
    assert got == expected[1:9]
    assert ogt.engine_counters(engine)["model_runs"] == runs + 1


@pytest.mark.parametrize("fault", [dict(phase="execute", kind="retryable"), dict(phase="execute", kind="capacity"),
                                   dict(phase="sample")], ids=["retryable", "capacity", "sample"])
def test_rollback_keeps_the_proposal_for_the_retry(fault):
    prompt = [5, 9, 13]
    expected, _ = oracle(prompt, max_gen=20)
    model, engine = draft_engine()
    r = engine.create_request()
    _, buffer = decode_ready(engine, r, prompt, max_gen=20)
    r.set_draft_tokens(expected[1:6])
    ogt.inject_fault(model, **fault)
    evs = list(engine.run(buffer))
    assert len(evs) == 1 and evs[0].request is None  # the step rolled back
    ogt.check_invariants(engine)
    evs = list(engine.run(buffer))  # the retry verifies the same proposal
    assert [e.token for e in evs] == expected[1:7]
    stats = engine.get_speculative_stats()
    assert stats["rounds"] == 1 and stats["draft_tokens_evaluated"] == 5


def test_terminal_boundaries_discard_the_proposal():
    prompt = [5, 9, 13]
    expected, _ = oracle(prompt, max_gen=20)
    _, engine = draft_engine()
    r = engine.create_request()
    _, buffer = decode_ready(engine, r, prompt, max_gen=20)
    r.set_draft_tokens(expected[1:4])
    assert r.cancel_turn(1)
    drive(engine, buffer)
    # The next turn decodes without the old proposal.
    r.begin_turn([7], turn_options(r, max_gen=2))
    drive(engine, buffer)
    assert engine.get_speculative_stats()["rounds"] == 0


def test_a_committed_decode_consumes_the_whole_proposal():
    # The budget leaves room for no draft at all: the decode commits and the proposal is gone.
    prompt = [5, 9, 13]
    expected, _ = oracle(prompt, max_gen=20)
    _, engine = draft_engine(max_scheduled_tokens=2, max_batch_size=2)
    r = engine.create_request()
    other = engine.create_request()
    _, buffer = decode_ready(engine, r, prompt, max_gen=20)
    other.begin_turn([6, 10], turn_options(other, max_gen=20))
    engine.run(buffer)  # other's prefill beside r's decode
    r.set_draft_tokens(expected[2:3])
    engine.run(buffer)  # both decode: the budget (2) holds only the mandatory tokens
    assert engine.get_speculative_stats()["rounds"] == 0
    other.close()  # the budget is free again, but the proposal was consumed: nothing to verify
    engine.run(buffer)
    assert engine.get_speculative_stats()["rounds"] == 0
    r.set_draft_tokens(expected[4:5])  # a new proposal is verified
    engine.run(buffer)
    assert engine.get_speculative_stats()["rounds"] == 1


def test_set_draft_tokens_admission_rules():
    _, plain = draft_engine(per_token_logits=False)
    r = plain.create_request()
    decode_ready(plain, r, [5, 9, 13], max_gen=10)
    with pytest.raises(RuntimeError, match=r"^This engine does not support speculative draft verification\.$"):
        r.set_draft_tokens([4])

    model, engine = draft_engine()
    r = engine.create_request()
    with pytest.raises(RuntimeError, match=r"^Speculative draft tokens may only be proposed when the request is "
                                           r"ready to decode\.$"):
        r.set_draft_tokens([4])
    r.begin_turn([5, 9, 13], turn_options(r, max_gen=10))
    with pytest.raises(RuntimeError, match="ready to decode"):
        r.set_draft_tokens([4])  # queued, prefill not done
    engine.run(engine.create_event_buffer(8))
    with pytest.raises(RuntimeError, match=r"^A step accepts at most 7 draft tokens\.$"):
        r.set_draft_tokens(list(range(2, 10)))
    with pytest.raises(RuntimeError, match=r"outside the model's vocabulary"):
        r.set_draft_tokens([4, 64])
    r.set_draft_tokens([4, 5])
    with pytest.raises(RuntimeError):
        r.set_draft_tokens([4, -1])  # an invalid replacement keeps the previous proposal
    r.set_draft_tokens([])  # clears
    drive(engine)

    for setters, message in [
        (dict(repetition_penalty=1.2), "require repetition_penalty 1"),
        (dict(no_repeat_ngram_size=2), "require repetition_penalty 1"),
        (dict(min_generated_tokens=5), "past its minimum generated token count"),
        (dict(do_sample=True, top_k=0, top_p=0.9, seed=5), "^Sampled speculative draft tokens require a positive top_k\\.$"),
        (dict(do_sample=True, top_k=5, seed=5), "sampled turns is not supported yet"),
    ]:
        q = engine.create_request()
        decode_ready(engine, q, [5, 9, 13], max_gen=10, **setters)
        with pytest.raises(RuntimeError, match=message):
            q.set_draft_tokens([4])
        q.close()
    ogt.set_token_table(model, [f"t{t}" for t in range(64)], special=[0, 1])
    q = engine.create_request()
    decode_ready(engine, q, [5, 9, 13], max_gen=10, guidance=("regex", "(t[0-9])+"))
    with pytest.raises(RuntimeError, match=r"^Speculative draft tokens are not supported with guidance\.$"):
        q.set_draft_tokens([4])
    q.close()
    r.close()
    with pytest.raises(RuntimeError, match=r"^Cannot use a closed request\.$"):
        r.set_draft_tokens([4])


def test_drafts_on_an_onnx_model_with_per_token_logits(tmp_path):
    """A random Llama built with per-token logits: drafts taken from plain greedy decoding reproduce
    it exactly with fewer model runs."""
    import numpy as np

    from oga.models import build
    from oga.models.spec import DecoderSpec

    spec = DecoderSpec(
        architecture="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5, context_length=256,
        tie_word_embeddings=True, qkv_bias=False, sliding_window=None, bos_token_id=1, eos_token_ids=[2],
        pad_token_id=0)
    directory = build(None, tmp_path / "m", random_spec=spec, block_size=4, num_blocks=64, max_batch_size=4,
                      max_scheduled_tokens=64, per_token_logits=True)
    model = og.Model(str(directory))
    prompts = [np.array([5, 9, 13, 40], dtype=np.int32), np.array([7, 100, 3], dtype=np.int32)]
    plain = og.Engine(model)
    plain_requests = []
    for p in prompts:
        r = plain.create_request()
        r.begin_turn(p, turn_options(r, max_gen=24))
        plain_requests.append(r)
    evs = drive(plain, check=False)
    expected = [[e.token for e in evs if e.request is r and e.flags & TOKEN] for r in plain_requests]
    engine = og.Engine(model)
    assert engine.max_draft_tokens_per_proposal() == 7
    requests = []
    for p in prompts:
        r = engine.create_request()
        r.begin_turn(p, turn_options(r, max_gen=24))
        requests.append(r)
    tokens, _, runs = run_with_drafts(engine, requests,
                                      lambda r, emitted: expected[requests.index(r)][len(emitted):len(emitted) + 5])
    assert tokens == expected
    assert runs < ogt.engine_counters(plain)["model_runs"] / 2
