"""Per-turn generation policy: sampling distributions (chi-square against the analytic distribution of
the test executor's logits), per-request random streams and per-turn seeds, repetition penalty,
no-repeat n-gram, min_generated_tokens, and policy resolution / validation (0.18's rules and texts;
oga.h, "Turn options").

Sampling semantics under test (logits processing order for one row):
  1. EOS ids masked while the turn has generated fewer than min_generated_tokens;
  2. repetition penalty over every distinct token of the request's sequence
     (logit > 0 -> logit / penalty, else logit * penalty);
  3. no-repeat n-gram (n > 0): a token that would complete an n-gram already in the sequence is masked;
  4. greedy (argmax, lowest index on ties) when the resolved policy is greedy (do_sample false, top_k 1 or
     temperature 0); otherwise scale by 1/temperature, keep the top_k largest (0 = all; ties: lowest index),
     softmax, keep the smallest descending-probability prefix whose cumulative probability >= top_p when
     0 < top_p < 1, renormalise, draw with the request's random stream.
Streams: per request, seeded from search.random_seed (else the OS) at creation; a turn seed reseeds at the
first sampling step of the turn (durable on commit; pending across rollbacks; discarded if the turn ends
before sampling). Greedy steps draw nothing; other requests never shift a request's draws.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import numpy as np
import pytest

import oga as og
import oga.testing as ogt
from helpers import (
    R_CANCELLED, R_EOS, R_MAX_GEN, RETRYABLE, TOKEN, TURN_FINISHED, OracleSequence, find_prompt, logits,
    oracle_turn, prompt_without_eos,
)

VOCAB = 64
EOS = 1
PROMPT = [5, 9, 13, 17]
EOS_PROMPT = [2, 4, 7]  # plain greedy: EOS first (checked in test_distribution_cases_exercise_the_cuts)


# --------------------------------------------------------------------------------------------
# Python oracle of the logits processing pipeline
# --------------------------------------------------------------------------------------------
def processed_logits(seq: OracleSequence, *, generated=0, min_gen=0, penalty=1.0, ngram=0,
                     vocab=VOCAB) -> np.ndarray:
    """float32 logits of the next position after `seq`, after EOS masking, repetition penalty and the
    no-repeat n-gram mask (masked = -inf)."""
    row = logits(seq.state, vocab).astype(np.float32)
    if generated < min_gen:
        row[EOS] = -np.inf
    p = np.float32(penalty)
    if p != np.float32(1.0):
        for t in set(seq.tokens):
            x = row[t]
            row[t] = np.float32(x / p) if x > 0 else np.float32(x * p)
    if ngram > 0:
        toks = seq.tokens
        n = ngram
        if len(toks) >= n - 1:
            tail = toks[len(toks) - (n - 1):] if n > 1 else []
            for i in range(len(toks) - n + 1):
                if toks[i:i + n - 1] == tail:
                    row[toks[i + n - 1]] = -np.inf
    return row


def greedy_policy_turn(seq: OracleSequence, prompt, max_gen, *, min_gen=0, penalty=1.0, ngram=0):
    """Greedy turn under the full processing pipeline. Returns (tokens, reason)."""
    seq.extend(prompt)
    out: List[int] = []
    while True:
        row = processed_logits(seq, generated=len(out), min_gen=min_gen, penalty=penalty, ngram=ngram)
        order = np.argsort(-row.astype(np.float64), kind="stable")
        t = int(order[0])
        # The oracle must not depend on float rounding: the winner must be clear.
        assert row[order[0]] > row[order[1]], "oracle near-tie; pick another configuration"
        if t == EOS:
            return out, R_EOS
        seq.append(t)
        out.append(t)
        if len(out) >= max_gen:
            return out, R_MAX_GEN


def sample_distribution(tokens: Sequence[int], temperature, top_k, top_p, *, min_gen=0, penalty=1.0, ngram=0,
                        vocab=VOCAB):
    """Analytic next-token distribution (float64 probabilities from float32 logits). Returns
    (probs[vocab], margin) where margin is the distance of the top-k / top-p cut from ambiguity."""
    seq = OracleSequence(vocab=vocab)
    seq.extend(tokens)
    row = processed_logits(seq, generated=0, min_gen=min_gen, penalty=penalty, ngram=ngram, vocab=vocab)
    z = row.astype(np.float64) / float(np.float32(temperature))
    finite = [v for v in range(vocab) if np.isfinite(z[v])]
    order = sorted(finite, key=lambda v: (-z[v], v))
    margin = math.inf
    if top_k > 0 and top_k < len(order):
        margin = min(margin, z[order[top_k - 1]] - z[order[top_k]])
        order = order[:top_k]
    zz = np.array([z[v] for v in order])
    w = np.exp(zz - zz.max())
    p = w / w.sum()
    top_p = float(np.float32(top_p))
    if 0.0 < top_p < 1.0:
        cum = np.cumsum(p)
        n = int(np.searchsorted(cum, top_p, side="left")) + 1  # smallest prefix with cum >= top_p
        n = min(n, len(order))
        margin = min(margin, float(np.min(np.abs(cum - top_p))))
        order = order[:n]
        p = p[:n] / p[:n].sum()
    probs = np.zeros(vocab)
    for v, q in zip(order, p):
        probs[v] = q
    return probs, margin


# --------------------------------------------------------------------------------------------
# Chi-square survival function (regularized upper incomplete gamma), plain Python
# --------------------------------------------------------------------------------------------
def _gamma_q(a: float, x: float) -> float:
    if x <= 0:
        return 1.0
    gln = math.lgamma(a)
    if x < a + 1.0:
        ap, s, d = a, 1.0 / a, 1.0 / a
        for _ in range(10000):
            ap += 1.0
            d *= x / ap
            s += d
            if abs(d) < abs(s) * 1e-15:
                break
        return max(0.0, 1.0 - s * math.exp(-x + a * math.log(x) - gln))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < tiny:
            d = tiny
        c = b + an / c
        if abs(c) < tiny:
            c = tiny
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - gln) * h


def chi2_sf(stat: float, df: int) -> float:
    return _gamma_q(df / 2.0, stat / 2.0)


def test_chi2_sf_reference_values():
    # Known quantiles: chi2.sf(3.841459, 1) = 0.05, chi2.sf(18.307038, 10) = 0.05, sf(100, 60) ~ 0.00087.
    assert abs(chi2_sf(3.841459, 1) - 0.05) < 1e-6
    assert abs(chi2_sf(18.307038, 10) - 0.05) < 1e-6
    assert abs(chi2_sf(2.0, 2) - math.exp(-1.0)) < 1e-12
    assert abs(chi2_sf(0.5, 4) - math.exp(-0.25) * 1.25) < 1e-12


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square over the support of `probs`; bins (sorted by expected count) are grouped until
    each group expects at least 5 draws."""
    n = counts.sum()
    bins = sorted((n * probs[v], counts[v]) for v in range(len(probs)) if probs[v] > 0)
    merged = []
    group_e = group_o = 0.0
    for e, o in bins:
        group_e += e
        group_o += o
        if group_e >= 5.0:
            merged.append((group_e, group_o))
            group_e = group_o = 0.0
    if group_e > 0:
        if merged:
            e, o = merged.pop()
            group_e += e
            group_o += o
        merged.append((group_e, group_o))
    assert len(merged) >= 2, "too few bins for a chi-square test"
    stat = sum((o - e) ** 2 / e for e, o in merged)
    return chi2_sf(stat, len(merged) - 1)


# --------------------------------------------------------------------------------------------
# Drivers
# --------------------------------------------------------------------------------------------
def apply_options(request, opts: Optional[dict]):
    t = og.TurnOptions(request)
    for name, value in (opts or {}).items():
        getattr(t, "set_" + name)(value)
    return t


def sample_first_tokens(n, seed_base, opts, prompt=PROMPT, vocab=VOCAB):
    """First generated token (EOS included as EOS) of n requests with seeds seed_base + i, all submitted
    at once to a batched engine (max_batch_size 64); each request is closed when its turn finishes."""
    model = ogt.create_test_model(vocab_size=vocab, max_batch_size=64, num_blocks=1024, context_length=64)
    engine = og.Engine(model)
    buf = engine.create_event_buffer(256)
    reqs = {}
    for i in range(n):
        r = engine.create_request()
        o = dict(opts)
        o["seed"] = seed_base + i
        o["max_generated_tokens"] = 1
        assert r.begin_turn(prompt, apply_options(r, o)) == 1
        reqs[id(r)] = r
    counts = np.zeros(vocab, dtype=np.int64)
    runs = 0
    while engine.has_pending_requests():
        runs += 1
        assert runs < 10000
        finished = []
        for e in engine.run(buf):
            assert e.request is not None, "unexpected engine event"
            flags = int(e.flags)
            if flags & TOKEN:
                counts[e.token] += 1
            elif flags & TURN_FINISHED:
                assert int(e.finish_reason) == R_EOS
                counts[EOS] += 1
            if flags & TURN_FINISHED:
                finished.append(e.request)
        for r in finished:
            r.close()
            del reqs[id(r)]
    assert not reqs
    assert counts.sum() == n
    return counts


def run_jobs(jobs, *, model=None, model_cfg=None, capacity=64, fault=None, start_runs=None, check=True):
    """jobs: list of lists of turns; a turn is a dict {prompt, opts (TurnOptions setters), cancel}.
    Each job's next turn begins as soon as its previous turn finished; job j starts after start_runs[j]
    Runs. Returns (per job: list of (tokens, reason) per turn, number of request-less retryable events)."""
    if model is None:
        model = ogt.create_test_model(**(model_cfg or {}))
    if fault is not None:
        ogt.inject_fault(model, **fault)
    engine = og.Engine(model)
    buf = engine.create_event_buffer(capacity)
    n = len(jobs)
    start_runs = start_runs or [0] * n
    reqs: List[Optional[object]] = [None] * n
    nxt = [0] * n
    done = [False] * n
    results: List[list] = [[] for _ in range(n)]
    current: List[list] = [[] for _ in range(n)]
    retryable = 0

    def begin(j):
        if reqs[j] is None:
            reqs[j] = engine.create_request()
        turn = jobs[j][nxt[j]]
        tid = reqs[j].begin_turn(turn["prompt"], apply_options(reqs[j], turn.get("opts")))
        nxt[j] += 1
        assert tid == nxt[j]
        current[j] = []
        if turn.get("cancel"):
            assert reqs[j].cancel_turn(tid) is True

    runs = 0
    while True:
        for j in range(n):
            if reqs[j] is None and not done[j] and start_runs[j] <= runs:
                begin(j)
        if not engine.has_pending_requests():
            waiting = [j for j in range(n) if not done[j] and reqs[j] is None]
            if not waiting:
                break
            runs = max(runs, min(start_runs[j] for j in waiting))
            continue
        evs = [(e.request, int(e.flags), e.token, int(e.finish_reason)) for e in engine.run(buf)]
        if check:
            ogt.check_invariants(engine)
        runs += 1
        assert runs < 20000
        index = {id(r): j for j, r in enumerate(reqs) if r is not None}
        finished = []
        for req, flags, token, reason in evs:
            if req is None:
                assert flags == RETRYABLE, flags
                retryable += 1
                continue
            j = index[id(req)]
            if flags & TOKEN:
                current[j].append(token)
            if flags & TURN_FINISHED:
                results[j].append((current[j], reason))
                finished.append(j)
        for j in finished:
            if nxt[j] < len(jobs[j]):
                begin(j)
            else:
                reqs[j].close()
                reqs[j] = None
                done[j] = True
    return results, retryable


def sampled(seed=None, temperature=1.5, max_gen=12, **extra):
    o = {"do_sample": True, "temperature": temperature, "max_generated_tokens": max_gen}
    if seed is not None:
        o["seed"] = seed
    o.update(extra)
    return o


def greedy(max_gen=8, **extra):
    o = {"max_generated_tokens": max_gen}
    o.update(extra)
    return o


def long_prompt(n, offset=0, length=3):
    """A prompt whose greedy continuation runs n tokens without EOS (so sampled runs are long too)."""
    return prompt_without_eos(n, length=length, offset=offset)


# --------------------------------------------------------------------------------------------
# 1. Sampling distributions
# --------------------------------------------------------------------------------------------
# (name, TurnOptions setters); options not listed keep the model default (do_sample false, top_k 50,
# top_p 1.0, temperature 1.0); "prompt" picks another prompt than PROMPT.
CHI_CASES = [
    ("T1_all", dict(temperature=1.0, top_k=0)),
    ("T0.7_k10", dict(temperature=0.7, top_k=10)),
    ("T1.5_p0.8", dict(temperature=1.5, top_k=0, top_p=0.8)),
    ("T1_k20_p0.65", dict(temperature=1.0, top_k=20, top_p=0.65)),
    ("T2_k5_p0.8", dict(temperature=2.0, top_k=5, top_p=0.8)),
    ("T0.5_defaults", dict(temperature=0.5)),
    ("T3_p0.3", dict(temperature=3.0, top_k=0, top_p=0.3)),
    # EOS_PROMPT's greedy first token is EOS (p ~ 0.07 at T=1): min_generated_tokens must mask it.
    ("penalty_mingen", dict(temperature=1.0, top_k=0, repetition_penalty=2.0, min_generated_tokens=1,
                            prompt=EOS_PROMPT)),
    ("eos_allowed", dict(temperature=1.0, top_k=0, prompt=EOS_PROMPT)),
    ("ngram1_k30", dict(temperature=1.2, top_k=30, no_repeat_ngram_size=1)),
]
CHI_N = 3000


def _expected(opts):
    return sample_distribution(
        opts.get("prompt", PROMPT),
        opts["temperature"],
        opts.get("top_k", 50),
        opts.get("top_p", 1.0),
        min_gen=opts.get("min_generated_tokens", 0),
        penalty=opts.get("repetition_penalty", 1.0),
        ngram=opts.get("no_repeat_ngram_size", 0),
    )


@pytest.mark.parametrize("name,opts", CHI_CASES, ids=[c[0] for c in CHI_CASES])
def test_first_token_distribution_chi_square(name, opts):
    probs, margin = _expected(opts)
    assert margin > 1e-4, f"{name}: top-k/top-p cut too close to call ({margin})"
    o = dict(opts)
    o["do_sample"] = True
    prompt = o.pop("prompt", PROMPT)
    counts = sample_first_tokens(CHI_N, 10_000 * (1 + CHI_CASES.index((name, opts))), o, prompt=prompt)
    outside = [v for v in range(VOCAB) if probs[v] == 0 and counts[v] > 0]
    assert not outside, f"{name}: tokens outside the top-k / nucleus were drawn: {outside}"
    p = chi_square_pvalue(counts, probs)
    assert p > 1e-3, (f"{name}: chi-square p-value {p}; observed {counts.tolist()} "
                      f"expected {(probs * CHI_N).round(1).tolist()}")


def test_distribution_cases_exercise_the_cuts():
    """Sanity of the case table: the top-k / top-p cases really cut, the penalty case really differs."""
    support = {name: int((_expected(o)[0] > 0).sum()) for name, o in CHI_CASES}
    assert support["T1_all"] == VOCAB
    assert OracleSequence().turn(EOS_PROMPT) == ([], R_EOS)
    assert support["T0.7_k10"] == 10
    assert 1 < support["T1.5_p0.8"] < VOCAB
    assert 1 < support["T1_k20_p0.65"] < 20
    assert 1 < support["T3_p0.3"] < VOCAB
    assert support["T0.5_defaults"] == 50
    pen = _expected(dict(CHI_CASES)["penalty_mingen"])[0]
    plain = _expected(dict(CHI_CASES)["eos_allowed"])[0]
    assert pen[EOS] == 0 and plain[EOS] > 0.05
    assert abs(pen[EOS_PROMPT[1]] / pen[20] - plain[EOS_PROMPT[1]] / plain[20]) > 1e-2
    ng = _expected(dict(CHI_CASES)["ngram1_k30"])[0]
    assert all(ng[t] == 0 for t in PROMPT)


def test_distribution_with_repeated_prompt_tokens_and_ngram2():
    """no_repeat_ngram_size 2 over a prompt that ends with a token seen before: only its successors are
    masked; the penalty applies once per distinct token even when it repeats."""
    prompt = [7, 30, 7, 44, 7]
    opts = dict(temperature=1.0, top_k=0, no_repeat_ngram_size=2, repetition_penalty=1.5)
    probs, margin = _expected(dict(opts, prompt=prompt))
    assert probs[30] == 0 and probs[44] == 0 and probs[7] > 0
    o = dict(opts)
    o["do_sample"] = True
    counts = sample_first_tokens(2000, 777_000, o, prompt=prompt)
    assert counts[30] == 0 and counts[44] == 0
    p = chi_square_pvalue(counts, probs)
    assert p > 1e-3, f"p-value {p}; observed {counts.tolist()} expected {(probs * 2000).round(1).tolist()}"


def test_chi_square_has_power_against_near_miss_distributions():
    """The fixed-seed samples of two cases reject plausible implementation slips: a nucleus one token too
    wide or too narrow, a top-k off by one, temperature off by 15%."""
    o = dict(CHI_CASES)["T1.5_p0.8"]
    counts = sample_first_tokens(CHI_N, 20_000, dict(o, do_sample=True))
    probs, _ = _expected(o)
    assert chi_square_pvalue(counts, probs) > 1e-3
    n = int((probs > 0).sum())
    z = logits(_state(PROMPT), VOCAB).astype(np.float64) / 1.5
    order = sorted(range(VOCAB), key=lambda v: (-z[v], v))
    for width in (n - 1, n + 1):
        alt = np.zeros(VOCAB)
        w = np.exp(np.array([z[v] for v in order[:width]]) - z[order[0]])
        alt[order[:width]] = w / w.sum()
        assert _pvalue_or_zero(counts, alt) < 1e-3, width
    for t in (1.5 * 0.85, 1.5 * 1.15):
        alt, _ = sample_distribution(PROMPT, t, 0, 0.8)
        assert _pvalue_or_zero(counts, alt) < 1e-3, t
    o = dict(CHI_CASES)["T0.7_k10"]
    counts = sample_first_tokens(CHI_N, 30_000, dict(o, do_sample=True))
    for k in (9, 11):
        alt, _ = sample_distribution(PROMPT, 0.7, k, 1.0)
        assert _pvalue_or_zero(counts, alt) < 1e-3, k


def _state(tokens):
    seq = OracleSequence()
    seq.extend(tokens)
    return seq.state


def _pvalue_or_zero(counts, probs):
    """p-value of counts under probs; 0 when a draw falls outside the support of probs."""
    if any(counts[v] > 0 and probs[v] == 0 for v in range(len(probs))):
        return 0.0
    return chi_square_pvalue(counts, probs)


LARGE_VOCAB = 4096
# Found offline (see the assertions): with vocab 4096, after [87, 183] the two largest logits tie
# (tokens 1883 < 3236); after [2, 9] the logits ranked 239th and 240th tie (tokens 928 < 3598).
GREEDY_TIE_PROMPT, GREEDY_TIE = [87, 183], (1883, 3236)
TOPK_TIE_PROMPT, TOPK_TIE_RANK, TOPK_TIE = [2, 9], 238, (928, 3598)


def _ranked(tokens, vocab=LARGE_VOCAB):
    row = logits(_state(tokens), vocab)
    return row, sorted(range(vocab), key=lambda v: (-float(row[v]), v))


def test_greedy_ties_pick_the_lowest_index():
    row, order = _ranked(GREEDY_TIE_PROMPT)
    assert order[:2] == list(GREEDY_TIE) and row[GREEDY_TIE[0]] == row[GREEDY_TIE[1]]
    model = ogt.create_test_model(vocab_size=LARGE_VOCAB)
    jobs = [[{"prompt": GREEDY_TIE_PROMPT, "opts": greedy(max_gen=1)}],
            [{"prompt": GREEDY_TIE_PROMPT, "opts": {"max_generated_tokens": 1, "do_sample": True, "top_k": 1}}],
            [{"prompt": GREEDY_TIE_PROMPT, "opts": {"max_generated_tokens": 1, "repetition_penalty": 1.5}}],
            [{"prompt": GREEDY_TIE_PROMPT, "opts": {"max_generated_tokens": 1, "do_sample": True,
                                                    "temperature": 0.0}}]]
    res, _ = run_jobs(jobs, model=model)
    assert all(r == [([GREEDY_TIE[0]], R_MAX_GEN)] for r in res), res


def test_top_k_ties_at_the_cut_keep_the_lowest_index():
    row, order = _ranked(TOPK_TIE_PROMPT)
    r = TOPK_TIE_RANK
    assert (order[r], order[r + 1]) == TOPK_TIE and row[order[r]] == row[order[r + 1]]
    assert row[order[r - 1]] > row[order[r]] > row[order[r + 2]]
    # Temperature 1000: nearly uniform over the kept tokens, so each tie member would show up ~17 times.
    base = dict(do_sample=True, temperature=1000.0, top_k=r + 1)
    counts = sample_first_tokens(4000, 40_000, base, prompt=TOPK_TIE_PROMPT, vocab=LARGE_VOCAB)
    probs, _ = sample_distribution(TOPK_TIE_PROMPT, 1000.0, r + 1, 1.0, vocab=LARGE_VOCAB)
    assert probs[TOPK_TIE[1]] == 0 and probs[TOPK_TIE[0]] > 0
    assert counts[TOPK_TIE[1]] == 0 and counts[TOPK_TIE[0]] > 0
    assert not [v for v in range(LARGE_VOCAB) if counts[v] and not probs[v]]
    assert chi_square_pvalue(counts, probs) > 1e-3
    counts = sample_first_tokens(4000, 50_000, dict(base, top_k=r + 2), prompt=TOPK_TIE_PROMPT, vocab=LARGE_VOCAB)
    assert counts[TOPK_TIE[1]] > 0 and counts[TOPK_TIE[0]] > 0


@pytest.mark.parametrize("temperature,top_k,top_p", [(5.0, 0, 0.9), (2.0, 3000, 0.7), (1.0, 0, 0.5)])
def test_large_vocabulary_nucleus(temperature, top_k, top_p):
    """Nuclei of more than 1024 tokens (the sampler buckets candidates and sorts only the boundary bucket)."""
    probs, margin = sample_distribution(TOPK_TIE_PROMPT, temperature, top_k, top_p, vocab=LARGE_VOCAB)
    assert margin > 1e-6
    support = int((probs > 0).sum())
    assert 300 < support < (top_k or LARGE_VOCAB)
    counts = sample_first_tokens(4000, 60_000 + int(temperature * 1000), dict(
        do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p), prompt=TOPK_TIE_PROMPT,
        vocab=LARGE_VOCAB)
    outside = [v for v in range(LARGE_VOCAB) if counts[v] and not probs[v]]
    assert not outside, outside
    assert chi_square_pvalue(counts, probs) > 1e-3


# --------------------------------------------------------------------------------------------
# 2. Seeds and streams
# --------------------------------------------------------------------------------------------
def _tokens(results, j):
    return [toks for toks, _ in results[j]]


def test_same_seed_same_stream_alone_batched_and_across_capacities():
    p0 = long_prompt(16)
    target = [{"prompt": p0, "opts": sampled(seed=4242, max_gen=16)},
              {"prompt": [3, 4], "opts": sampled(max_gen=10)}]
    alone, _ = run_jobs([target])
    assert len(alone[0][0][0]) >= 4, "pick a prompt whose sampled stream is longer"
    others = [
        [{"prompt": [11, 12, 13], "opts": greedy(max_gen=9)}, {"prompt": [2], "opts": sampled(seed=1, max_gen=5)}],
        [{"prompt": [20, 21], "opts": sampled(seed=4242, max_gen=12, temperature=0.9)}],
        [{"prompt": [30, 31, 32, 33, 34, 35], "opts": sampled(max_gen=14)}],
        [{"prompt": [40], "opts": greedy(max_gen=20)}],
        [{"prompt": [50, 51, 52], "opts": sampled(seed=99, max_gen=7, top_k=5)}],
        [{"prompt": [60, 61, 62, 63], "opts": greedy(max_gen=3)}, {"prompt": [5], "opts": greedy(max_gen=4)}],
        [{"prompt": p0, "opts": sampled(seed=4243, max_gen=16)}],
    ]
    for capacity in (64, 3, 1):
        batched, _ = run_jobs([target] + others, capacity=capacity, start_runs=[0, 0, 1, 2, 0, 3, 0, 1])
        assert _tokens(batched, 0) == _tokens(alone, 0), capacity
        # Reversed submission order, the target joining late.
        batched2, _ = run_jobs(others + [target], capacity=capacity, start_runs=[0, 0, 1, 0, 0, 2, 0, 4])
        assert _tokens(batched2, 7) == _tokens(alone, 0), capacity
    # Smaller batches (the target queues) and chunked prefill.
    for cfg in ({"max_batch_size": 2}, {"chunk_size": 2}, {"max_batch_size": 3, "max_scheduled_tokens": 8}):
        batched, _ = run_jobs([target] + others, model_cfg=cfg, start_runs=[1, 0, 0, 0, 0, 0, 0, 0])
        assert _tokens(batched, 0) == _tokens(alone, 0), cfg


def test_greedy_neighbours_are_unaffected_by_sampled_ones():
    jobs = [[{"prompt": [11, 12, 13], "opts": greedy(max_gen=9)}],
            [{"prompt": [20, 21], "opts": sampled(seed=7, max_gen=12)}],
            [{"prompt": [40], "opts": greedy(max_gen=20)}],
            [{"prompt": [22, 23], "opts": sampled(max_gen=12, temperature=3.0)}]]
    res, _ = run_jobs(jobs)
    for j, (p, m) in ((0, ([11, 12, 13], 9)), (2, ([40], 20))):
        assert res[j][0] == oracle_turn(p, max_gen=m), j


def test_different_seeds_give_different_streams():
    p0 = long_prompt(16)
    # EOS masked for the whole turn, so every stream is 16 tokens long whatever the draws
    jobs = [[{"prompt": p0, "opts": sampled(seed=s, temperature=3.0, max_gen=16, top_k=0, min_generated_tokens=16)}]
            for s in range(8)]
    jobs.append([{"prompt": p0, "opts": sampled(seed=0, temperature=3.0, max_gen=16, top_k=0,
                                                min_generated_tokens=16)}])
    res, _ = run_jobs(jobs, model_cfg={"max_batch_size": 16})
    streams = [tuple(res[j][0][0]) for j in range(8)]
    assert all(len(s) == 16 for s in streams), streams
    assert len(set(streams)) == 8, streams
    assert tuple(res[8][0][0]) == streams[0]  # seed 0 is a valid, reproducible seed


def test_unseeded_requests_draw_from_independent_os_seeded_streams():
    p0 = long_prompt(16)
    jobs = [[{"prompt": p0, "opts": sampled(temperature=3.0, max_gen=16, top_k=0)}] for _ in range(4)]
    res, _ = run_jobs(jobs)
    streams = [tuple(res[j][0][0]) for j in range(4)]
    assert len(set(streams)) == 4, streams


def test_unseeded_requests_of_two_engines_draw_differently():
    # The seed bases come from each engine's own sequence, seeded from the OS once per engine: the
    # first request of two engines must not share a stream.
    p0 = long_prompt(16)
    jobs = [[{"prompt": p0, "opts": sampled(temperature=3.0, max_gen=16, top_k=0)}]]
    firsts = {tuple(run_jobs(jobs)[0][0][0][0]) for _ in range(3)}
    assert len(firsts) == 3, firsts


def test_model_random_seed_seeds_every_request():
    model = ogt.create_test_model(search={"random_seed": 31337})
    p0 = long_prompt(16)
    job = [{"prompt": p0, "opts": sampled(temperature=3.0, max_gen=16, top_k=0)},
           {"prompt": [6, 7], "opts": sampled(temperature=2.0, max_gen=8)}]
    res, _ = run_jobs([job, job, [{"prompt": [9], "opts": greedy(max_gen=4)}], job], model=model,
                      start_runs=[0, 2, 0, 5])
    assert res[0] == res[1] == res[3]
    # A second engine over a fresh model with the same random_seed reproduces it.
    res2, _ = run_jobs([job], model=ogt.create_test_model(search={"random_seed": 31337}))
    assert res2[0] == res[0]
    res3, _ = run_jobs([job], model=ogt.create_test_model(search={"random_seed": 31338}))
    assert res3[0][0] != res[0][0]


def test_turn_seed_below_2_pow_32_reproduces_the_model_random_seed():
    """Per-turn seed values < 2^32 reproduce the classic search.random_seed (as in 0.18)."""
    p0 = long_prompt(16)
    by_model, _ = run_jobs([[{"prompt": p0, "opts": sampled(temperature=3.0, max_gen=16, top_k=0)}]],
                           model=ogt.create_test_model(search={"random_seed": 1234}))
    by_turn, _ = run_jobs([[{"prompt": p0, "opts": sampled(seed=1234, temperature=3.0, max_gen=16, top_k=0)}]])
    assert by_turn[0] == by_model[0]


def test_unseeded_turn_continues_the_stream_and_a_seed_restarts_it():
    p0 = long_prompt(16)
    first = {"prompt": p0, "opts": sampled(seed=555, temperature=3.0, max_gen=10, top_k=0)}
    cont = {"prompt": [3, 4], "opts": sampled(temperature=3.0, max_gen=12, top_k=0)}
    reseed = {"prompt": [3, 4], "opts": sampled(seed=555, temperature=3.0, max_gen=12, top_k=0)}
    other = {"prompt": [3, 4], "opts": sampled(seed=556, temperature=3.0, max_gen=12, top_k=0)}
    res, _ = run_jobs([[first, cont], [first, cont], [first, reseed], [first, other]])
    assert res[0] == res[1]
    assert res[0][0] == res[2][0] == res[3][0]
    assert len(res[0][1][0]) >= 4
    # The reseeded turn restarts the stream (differs from the continued one and from another seed).
    assert res[2][1] != res[0][1]
    assert res[3][1] != res[0][1] and res[3][1] != res[2][1]
    # The reseed matches a fresh request that starts from the same sequence with the same seed.
    seq_tokens = p0 + res[0][0][0]
    fresh, _ = run_jobs([[{"prompt": seq_tokens + [3, 4], "opts": sampled(seed=555, temperature=3.0, max_gen=12,
                                                                          top_k=0)}]])
    assert fresh[0][0] == res[2][1]


def test_seed_of_a_turn_cancelled_before_sampling_is_discarded():
    model_seed = {"random_seed": 2024}
    p, q = [5, 9, 13], long_prompt(12, length=2)
    t2 = {"prompt": q, "opts": sampled(temperature=3.0, max_gen=12, top_k=0)}
    jobs = [
        # The first turn (seed 77) is cancelled before admission; its seed must not survive.
        [{"prompt": p, "opts": sampled(seed=77, temperature=3.0, max_gen=12, top_k=0), "cancel": True}, t2],
        # Same sequence in one turn, no seed: the creation stream (model random_seed).
        [{"prompt": p + q, "opts": sampled(temperature=3.0, max_gen=12, top_k=0)}],
        # Same sequence in one turn, seed 77.
        [{"prompt": p + q, "opts": sampled(seed=77, temperature=3.0, max_gen=12, top_k=0)}],
    ]
    res, _ = run_jobs(jobs, model=ogt.create_test_model(search=model_seed))
    assert res[0][0] == ([], R_CANCELLED)
    assert len(res[1][0][0]) >= 4
    assert res[0][1] == res[1][0]
    assert res[2][0] != res[1][0]


def test_greedy_turns_do_not_shift_the_sampled_stream():
    """A: sampled(seed) | greedy 6 tokens | sampled (no seed). B: the same sequence reached with 3 + 1
    greedy steps (two greedy turns): the final sampled turn must be identical."""
    p0 = long_prompt(16)
    q = [8, 9]
    # A greedy continuation of 6 tokens without EOS after the sampled turn: computed after the fact.
    s1 = {"prompt": p0, "opts": sampled(seed=99, temperature=2.0, max_gen=6, top_k=0)}
    last = {"prompt": [3, 4], "opts": sampled(temperature=2.0, max_gen=12, top_k=0)}
    res_a, _ = run_jobs([[s1, {"prompt": q, "opts": greedy(max_gen=6)}, last]])
    a1, (g, g_reason) = res_a[0][0][0], res_a[0][1]
    oracle = OracleSequence()
    oracle.extend(p0 + a1)
    assert (g, g_reason) == oracle.turn(q, max_gen=6)
    assert len(g) == 6, "greedy continuation hit EOS; choose another seed"
    res_b, _ = run_jobs([[s1, {"prompt": q, "opts": greedy(max_gen=3)}, {"prompt": g[3:5], "opts": greedy(max_gen=1)},
                          last]])
    assert res_b[0][0][0] == a1
    assert res_b[0][1][0] == g[:3] and res_b[0][2][0] == g[5:6]
    assert res_b[0][3] == res_a[0][2]
    assert len(res_a[0][2][0]) >= 4
    # And a request that skips the greedy part entirely but has the same final sequence (the greedy
    # tokens given as part of the last prompt) draws the same.
    res_c, _ = run_jobs([[s1, {"prompt": q + g + [3, 4], "opts": sampled(temperature=2.0, max_gen=12, top_k=0)}]])
    assert res_c[0][1] == res_a[0][2]
    # A seed on a greedy turn is never applied (the turn ends without sampling): it is discarded.
    res_d, _ = run_jobs([[s1, {"prompt": q, "opts": greedy(max_gen=6, seed=5)}, last]])
    assert res_d[0] == res_a[0]


def _rollback_jobs():
    p0, p1 = long_prompt(14), long_prompt(14, offset=1)
    return [
        [{"prompt": p0, "opts": sampled(seed=11, max_gen=5, temperature=2.0, top_k=0)},
         {"prompt": [3, 4], "opts": sampled(seed=12, max_gen=6, temperature=2.0, top_k=0)},
         {"prompt": [5], "opts": sampled(max_gen=6, temperature=2.0, top_k=0)}],
        [{"prompt": p1, "opts": sampled(seed=21, max_gen=8, temperature=1.5, top_p=0.9)},
         {"prompt": [7, 8, 9], "opts": greedy(max_gen=3)},
         {"prompt": [6], "opts": sampled(max_gen=8, temperature=1.5)}],
        [{"prompt": [40, 41], "opts": greedy(max_gen=10)}],
    ]


@pytest.mark.parametrize("phase", ["execute", "sample"])
def test_rollback_keeps_sampled_streams(phase):
    jobs = _rollback_jobs()
    clean, retries = run_jobs(jobs, model_cfg={"chunk_size": 3})
    assert retries == 0
    assert len(clean[0][0][0]) >= 3 and len(clean[1][0][0]) >= 3
    for skip in (0, 1, 2, 3, 5, 6, 9, 13):
        for count in (1, 2):
            res, retries = run_jobs(jobs, model_cfg={"chunk_size": 3},
                                    fault=dict(phase=phase, kind="retryable", skip=skip, count=count))
            assert retries == count, (skip, count)
            assert res == clean, (phase, skip, count)


def test_rollback_of_a_seeded_first_step_keeps_the_reseed_pending():
    """A reseeding turn whose first step is rolled back twice (continuation on a resident request)."""
    p0 = long_prompt(14)
    job = [{"prompt": p0, "opts": sampled(seed=1, max_gen=6, temperature=2.0, top_k=0)},
           {"prompt": [3], "opts": sampled(seed=2, max_gen=8, temperature=2.0, top_k=0)}]
    clean, _ = run_jobs([job])
    model = ogt.create_test_model()
    engine = og.Engine(model)
    buf = engine.create_event_buffer(64)
    r = engine.create_request()
    r.begin_turn(job[0]["prompt"], apply_options(r, job[0]["opts"]))
    toks = []
    while engine.has_pending_requests():
        toks += [e.token for e in engine.run(buf) if int(e.flags) & TOKEN]
    assert toks == clean[0][0][0]
    r.begin_turn(job[1]["prompt"], apply_options(r, job[1]["opts"]))
    ogt.inject_fault(model, "execute", "retryable", skip=0, count=2)
    flags = [int(e.flags) for e in engine.run(buf)] + [int(e.flags) for e in engine.run(buf)]
    assert flags == [RETRYABLE, RETRYABLE]
    toks = []
    while engine.has_pending_requests():
        toks += [e.token for e in engine.run(buf) if int(e.flags) & TOKEN]
    assert toks == clean[0][1][0]


ALL_MASKED_PROMPT = [t for t in range(VOCAB) if t != EOS]  # with no_repeat_ngram_size 1 + min_generated 1


def test_rollback_after_a_sampled_row_keeps_the_stream_and_the_reseed():
    """A post-processing fault after the rows drew rolls the step back: the draw is not committed
    (unseeded turn) and the turn's reseed stays pending (seeded turns)."""
    p0 = long_prompt(14)
    job = [{"prompt": p0, "opts": sampled(seed=1, max_gen=6, temperature=2.0, top_k=0)},
           {"prompt": [3], "opts": sampled(seed=2, max_gen=8, temperature=2.0, top_k=0)},
           {"prompt": [4], "opts": sampled(max_gen=8, temperature=2.0, top_k=0)}]
    clean, _ = run_jobs([job])
    assert all(len(t) >= 3 for t, _ in clean[0])
    model = ogt.create_test_model()
    engine = og.Engine(model)
    buf = engine.create_event_buffer(64)
    a = engine.create_request()
    got = []
    for turn in job:
        a.begin_turn(turn["prompt"], apply_options(a, turn["opts"]))
        ogt.inject_fault(model, "sample", skip=0, count=1)
        rolled = ogt.engine_counters(engine)["rolled_back_steps"]
        first = [(e.request, int(e.flags)) for e in engine.run(buf)]
        assert first == [(None, RETRYABLE)], first
        assert ogt.engine_counters(engine)["rolled_back_steps"] == rolled + 1
        toks = []
        while engine.has_pending_requests():
            toks += [e.token for e in engine.run(buf) if e.request is a and int(e.flags) & TOKEN]
        got.append(toks)
    assert got == [t for t, _ in clean[0]]


def test_a_row_whose_processors_mask_every_token_falls_back_instead_of_stalling():
    """no_repeat_ngram_size 1 over a sequence holding every non-EOS token, with EOS masked by the
    minimum: nothing is selectable, so the row takes the top raw logit (EOS still masked while
    anything else is left) and its batch-mates keep progressing."""
    engine = og.Engine(ogt.create_test_model())
    buf = engine.create_event_buffer(64)
    blocked = engine.create_request()
    blocked.begin_turn(ALL_MASKED_PROMPT, apply_options(blocked, {"no_repeat_ngram_size": 1, "min_generated_tokens": 1,
                                                                  "max_generated_tokens": 2}))
    peer = engine.create_request()
    peer.begin_turn([5, 9, 13], apply_options(peer, {"max_generated_tokens": 3}))
    events = []
    while engine.has_pending_requests():
        events += [(e.request, int(e.flags), e.token) for e in engine.run(buf)]
        ogt.check_invariants(engine)
    assert all(r is not None for r, _, _ in events)  # no retryable stall
    blocked_tokens = [t for r, f, t in events if r is blocked and f & TOKEN]
    # The first token falls back (EOS still masked); after it, EOS is the only selectable token.
    assert len(blocked_tokens) == 1 and blocked_tokens[0] != EOS
    assert [f for r, f, _ in events if r is blocked][-1] == TURN_FINISHED
    assert len([t for r, f, t in events if r is peer and f & TOKEN]) == 3


# --------------------------------------------------------------------------------------------
# 3. Repetition penalty, no-repeat n-gram, min_generated_tokens (greedy, against the oracle)
# --------------------------------------------------------------------------------------------
PENALTY_CASES = [
    (1.3, 0), (2.0, 0), (0.7, 0), (5.0, 0),
    (1.0, 1), (1.0, 2), (1.0, 3),
    (1.5, 2), (0.8, 3),
]


def ngram_trap(n):
    """A prompt base + [x] + base (len(base) = n - 1, one leading token) whose plain greedy next token is x:
    no_repeat_ngram_size n must change the very first generated token."""
    for lead in range(2, VOCAB):
        for b in range(2, VOCAB):
            base = [lead, b][2 - (n - 1):] if n > 1 else []
            for x in range(2, VOCAB):
                p = [lead] + base + [x] + base if n > 1 else [lead, x]
                seq = OracleSequence()
                seq.extend(p)
                if seq.greedy() == x:
                    return p
    raise AssertionError("no trap prompt")


@pytest.mark.parametrize("penalty,ngram", PENALTY_CASES)
def test_penalty_and_ngram_greedy_match_the_oracle(penalty, ngram):
    prompts = [[5, 9, 5, 9, 13], [20, 21, 22], long_prompt(24, length=3), ngram_trap(2), ngram_trap(3)]
    jobs = []
    expected = []
    for p in prompts:
        opts = {"max_generated_tokens": 24}
        if penalty != 1.0:
            opts["repetition_penalty"] = penalty
        if ngram:
            opts["no_repeat_ngram_size"] = ngram
        jobs.append([{"prompt": p, "opts": opts},
                     {"prompt": [p[0], 2], "opts": opts}])
        seq = OracleSequence()
        expected.append([greedy_policy_turn(seq, p, 24, penalty=penalty, ngram=ngram),
                         greedy_policy_turn(seq, [p[0], 2], 24, penalty=penalty, ngram=ngram)])
    res, _ = run_jobs(jobs, model_cfg={"context_length": 128})
    for j in range(len(prompts)):
        assert res[j] == expected[j], (penalty, ngram, prompts[j])
    assert sum(len(t) for e in expected for t, _ in e) >= 60
    # The case is meaningful: the policy changes the plain greedy stream of at least one prompt.
    plain = []
    for p in prompts:
        seq = OracleSequence()
        plain.append([greedy_policy_turn(seq, p, 24), greedy_policy_turn(seq, [p[0], 2], 24)])
    assert plain != expected, (penalty, ngram)


def test_penalty_applies_to_previous_turns_and_continuation_input():
    p0 = long_prompt(10)
    jobs = [[{"prompt": p0, "opts": greedy(max_gen=10)},
             {"prompt": [p0[1], p0[2]], "opts": {"max_generated_tokens": 20, "repetition_penalty": 3.0,
                                               "no_repeat_ngram_size": 2}},
             {"prompt": [9], "opts": greedy(max_gen=10)}]]
    seq = OracleSequence()
    expected = [seq.turn(p0, max_gen=10),
                greedy_policy_turn(seq, [p0[1], p0[2]], 20, penalty=3.0, ngram=2)]
    # Turn 3 runs with the model defaults again (no penalty, no n-gram).
    expected.append(seq.turn([9], max_gen=10))
    res, _ = run_jobs(jobs)
    assert res[0] == expected


def test_model_search_defaults_for_penalty_and_ngram():
    model = ogt.create_test_model(search={"repetition_penalty": 1.7, "no_repeat_ngram_size": 2})
    p = [5, 9, 5, 9, 13]
    jobs = [[{"prompt": p, "opts": greedy(max_gen=20)}],
            [{"prompt": p, "opts": greedy(max_gen=20, repetition_penalty=1.0, no_repeat_ngram_size=0)}],
            [{"prompt": p, "opts": greedy(max_gen=20, no_repeat_ngram_size=0)}]]
    res, _ = run_jobs(jobs, model=model)
    assert res[0][0] == greedy_policy_turn(OracleSequence(), p, 20, penalty=1.7, ngram=2)
    assert res[1][0] == greedy_policy_turn(OracleSequence(), p, 20)
    assert res[2][0] == greedy_policy_turn(OracleSequence(), p, 20, penalty=1.7)


def _early_eos_prompt(k):
    """A prompt whose plain greedy turn ends with EOS after exactly k tokens."""
    return find_prompt(lambda p: OracleSequence().turn(p, max_gen=40)[1] == R_EOS
                       and len(OracleSequence().turn(p, max_gen=40)[0]) == k, length=3)


@pytest.mark.parametrize("k", [0, 2])
def test_min_generated_tokens_masks_eos(k):
    p = _early_eos_prompt(k)
    assert OracleSequence().turn(p, max_gen=40) == ([] if k == 0 else OracleSequence().turn(p, max_gen=k)[0], R_EOS)
    cases = [dict(min_gen=k + 1), dict(min_gen=k + 5), dict(min_gen=k + 5, penalty=1.4),
             dict(min_gen=k + 3, ngram=2)]
    jobs, expected = [], []
    for c in cases:
        opts = {"max_generated_tokens": 30, "min_generated_tokens": c["min_gen"]}
        if "penalty" in c:
            opts["repetition_penalty"] = c["penalty"]
        if "ngram" in c:
            opts["no_repeat_ngram_size"] = c["ngram"]
        jobs.append([{"prompt": p, "opts": opts}])
        expected.append([greedy_policy_turn(OracleSequence(), p, 30, min_gen=c["min_gen"],
                                            penalty=c.get("penalty", 1.0), ngram=c.get("ngram", 0))])
    res, _ = run_jobs(jobs)
    assert res == expected
    assert all(len(e[0][0]) >= c["min_gen"] for e, c in zip(expected, cases))


def test_min_generated_tokens_masks_eos_in_sampled_turns():
    """EOS never drawn before min_generated_tokens even where it is likely."""
    p = EOS_PROMPT
    probs, _ = sample_distribution(p, 1.0, 0, 1.0)
    assert probs[EOS] > 0.05
    model = ogt.create_test_model(max_batch_size=64, num_blocks=1024, context_length=64)
    engine = og.Engine(model)
    buf = engine.create_event_buffer(512)
    reqs = []
    for i in range(200):
        r = engine.create_request()
        r.begin_turn(p, apply_options(r, dict(do_sample=True, top_k=0, seed=i, max_generated_tokens=4,
                                              min_generated_tokens=3)))
        reqs.append(r)
    got = {}
    runs = 0
    while engine.has_pending_requests():
        runs += 1
        assert runs < 2000
        finished = []
        for e in engine.run(buf):
            assert e.request is not None
            got.setdefault(id(e.request), []).append((int(e.flags), e.token, int(e.finish_reason)))
            if int(e.flags) & TURN_FINISHED:
                finished.append(e.request)
        for r in finished:
            r.close()  # frees its residency slot for the queued requests
    ends = 0
    for r in reqs:
        evs = got[id(r)]
        toks = [t for f, t, _ in evs if f & TOKEN]
        assert len(toks) >= 3
        assert EOS not in toks
        if evs[-1][2] == R_EOS:
            ends += 1
            assert len(toks) == 3
    assert ends > 0  # EOS is drawn once allowed


# --------------------------------------------------------------------------------------------
# 4. Policy resolution and validation
# --------------------------------------------------------------------------------------------
def _begin_error(request, opts, prompt=(5, 9, 13)):
    with pytest.raises(RuntimeError) as info:
        request.begin_turn(list(prompt), apply_options(request, opts))
    return str(info.value)


GREEDY_TAIL = ("Either remove them or request sampling with do_sample=true, top_k != 1, and a nonzero temperature.")

RANGE_CASES = [
    (dict(do_sample=True, temperature=-1.0), "temperature (-1.000000) must be finite and 0 or greater."),
    (dict(do_sample=True, temperature=float("nan")), "temperature (nan) must be finite and 0 or greater."),
    (dict(do_sample=True, temperature=float("inf")), "temperature (inf) must be finite and 0 or greater."),
    (dict(do_sample=True, temperature=-0.5), "temperature (-0.500000) must be finite and 0 or greater."),
    (dict(do_sample=True, top_p=1.5), "top_p (1.500000) must be finite and between 0.0 and 1.0."),
    (dict(do_sample=True, top_p=-0.25), "top_p (-0.250000) must be finite and between 0.0 and 1.0."),
    (dict(do_sample=True, top_p=float("nan")), "top_p (nan) must be finite and between 0.0 and 1.0."),
    (dict(do_sample=True, top_k=-1), "top_k (-1) must be 0 or greater."),
    (dict(repetition_penalty=0.0), "repetition_penalty (0.000000) must be finite and greater than zero."),
    (dict(repetition_penalty=-2.0), "repetition_penalty (-2.000000) must be finite and greater than zero."),
    (dict(repetition_penalty=float("inf")), "repetition_penalty (inf) must be finite and greater than zero."),
    (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size (-1) must be 0 or greater."),
    (dict(do_sample=True, top_k=0, top_p=0.0),
     "A sampled turn requires a positive top_k or a positive top_p; both are 0."),
    (dict(do_sample=True, top_k=65), "top_k (65) must be less than or equal to vocab_size (64)."),
]


@pytest.mark.parametrize("opts,message", RANGE_CASES, ids=[m[:40] for _, m in RANGE_CASES])
def test_policy_validation_messages(engine, opts, message):
    r = engine.create_request()
    assert _begin_error(r, opts) == message
    # The rejection left the request untouched: a valid turn gets id 1 over the prompt alone.
    assert r.begin_turn([5, 9, 13], apply_options(r, greedy(max_gen=5))) == 1
    res = []
    buf = engine.create_event_buffer(16)
    while engine.has_pending_requests():
        res += [e.token for e in engine.run(buf) if int(e.flags) & TOKEN]
    assert res == OracleSequence().turn([5, 9, 13], max_gen=5)[0]


GREEDY_CONTRADICTIONS = [
    (dict(do_sample=False, top_k=40), ["top_k"]),
    (dict(top_k=40), ["top_k"]),  # the model default do_sample is false
    (dict(temperature=0.7), ["temperature"]),
    (dict(top_p=0.5), ["top_p"]),
    (dict(do_sample=False, temperature=0.7, top_k=40), ["temperature", "top_k"]),
    (dict(do_sample=True, top_k=1, temperature=0.7), ["temperature"]),
    (dict(do_sample=True, temperature=0.0, top_p=0.9), ["top_p"]),
    (dict(do_sample=True, temperature=0.0, top_k=5), ["top_k"]),
]


@pytest.mark.parametrize("opts,names", GREEDY_CONTRADICTIONS)
def test_greedy_contradictions_are_rejected(engine, opts, names):
    r = engine.create_request()
    msg = _begin_error(r, opts)
    assert msg.startswith("The resolved turn policy selects the top logit ("), msg
    assert "so these explicitly set sampling options contradict it: " + names[0] in msg, msg
    for n in names:
        assert n in msg.split("contradict it:")[1], msg
    assert msg.endswith(GREEDY_TAIL), msg
    assert r.begin_turn([5, 9, 13]) == 1


GREEDY_ACCEPTED = [
    dict(top_k=1),
    dict(temperature=0.0),
    dict(do_sample=False, top_k=1),
    dict(do_sample=False, temperature=0.0),
    dict(do_sample=False, top_p=1.0, top_k=0),
    dict(do_sample=False, temperature=1.0),
    dict(do_sample=True, top_k=1, temperature=0.0),
    dict(do_sample=True, top_k=1),
    dict(do_sample=True, temperature=0.0),
    dict(do_sample=False, top_p=0.0),
    dict(do_sample=True, top_k=1, seed=5),
]


def test_greedy_consistent_combinations_decode_greedily():
    prompt = long_prompt(12)
    jobs = [[{"prompt": prompt, "opts": dict(o, max_generated_tokens=12)}] for o in GREEDY_ACCEPTED]
    res, _ = run_jobs(jobs, model_cfg={"max_batch_size": 16})
    expected = OracleSequence().turn(prompt, max_gen=12)
    for o, r in zip(GREEDY_ACCEPTED, res):
        assert r == [expected], o


def test_model_default_greedy_overriding_explicit_do_sample():
    for search, field in (({"top_k": 1}, "search.top_k = 1"), ({"temperature": 0.0}, "search.temperature = 0")):
        engine = og.Engine(ogt.create_test_model(search=search))
        r = engine.create_request()
        msg = _begin_error(r, dict(do_sample=True))
        assert "do_sample=true" in msg and field in msg, msg
        # Without do_sample the model default greedy policy is fine.
        assert r.begin_turn([5, 9, 13], apply_options(r, greedy(max_gen=3))) == 1
        toks = []
        buf = engine.create_event_buffer(8)
        while engine.has_pending_requests():
            toks += [e.token for e in engine.run(buf) if int(e.flags) & TOKEN]
        assert toks == OracleSequence().turn([5, 9, 13], max_gen=3)[0]
        # Setting the overriding field on the turn admits a sampled turn.
        r2 = engine.create_request()
        fix = {"top_k": 5} if "top_k" in field else {"temperature": 1.0}
        assert r2.begin_turn([5, 9, 13], apply_options(r2, dict(do_sample=True, max_generated_tokens=3, **fix))) == 1
        while engine.has_pending_requests():
            engine.run(buf)


def test_model_top_k_above_vocabulary():
    engine = og.Engine(ogt.create_test_model(search={"top_k": 100}))
    r = engine.create_request()
    assert _begin_error(r, dict(do_sample=True)) == (
        "The model's search.top_k (100) exceeds vocab_size (64). Set top_k explicitly to a value no greater than "
        "vocab_size.")
    assert r.begin_turn([5, 9, 13], apply_options(r, dict(do_sample=True, top_k=64, max_generated_tokens=2))) == 1
    r2 = engine.create_request()
    assert r2.begin_turn([5, 9, 13], apply_options(r2, greedy(max_gen=2))) == 1  # greedy: top_k irrelevant


def test_rejections_leave_a_continuing_request_unchanged():
    model = ogt.create_test_model()
    engine = og.Engine(model)
    buf = engine.create_event_buffer(64)
    r = engine.create_request()
    assert r.begin_turn([5, 9, 13], apply_options(r, greedy(max_gen=4))) == 1
    first = []
    while engine.has_pending_requests():
        first += [e.token for e in engine.run(buf) if int(e.flags) & TOKEN]
    for opts, _ in RANGE_CASES:
        _begin_error(r, opts, prompt=[7, 7])
    for opts, _ in GREEDY_CONTRADICTIONS:
        _begin_error(r, opts, prompt=[7, 7])
    assert r.begin_turn([8], apply_options(r, greedy(max_gen=5))) == 2
    toks = []
    while engine.has_pending_requests():
        toks += [e.token for e in engine.run(buf) if int(e.flags) & TOKEN]
    oracle = OracleSequence()
    assert oracle.turn([5, 9, 13], max_gen=4)[0] == first
    assert oracle.turn([8], max_gen=5)[0] == toks


def test_unset_options_mean_the_model_default_not_the_previous_turn():
    p0 = long_prompt(20)
    # Model default greedy: a sampled turn, then an unset turn decodes greedily again.
    jobs = [[{"prompt": p0, "opts": sampled(seed=3, temperature=3.0, max_gen=6, top_k=0)},
             {"prompt": [4], "opts": greedy(max_gen=8)},
             {"prompt": [6], "opts": {"max_generated_tokens": 6, "repetition_penalty": 4.0,
                                     "no_repeat_ngram_size": 1, "min_generated_tokens": 6}},
             {"prompt": [10], "opts": greedy(max_gen=8)}]]
    res, _ = run_jobs(jobs)
    seq = OracleSequence()
    seq.extend(p0 + res[0][0][0])
    assert res[0][1] == greedy_policy_turn(seq, [4], 8)
    assert res[0][2] == greedy_policy_turn(seq, [6], 6, min_gen=6, penalty=4.0, ngram=1)
    assert res[0][3] == greedy_policy_turn(seq, [10], 8)


def test_model_default_sampling_and_per_turn_greedy_override():
    model = ogt.create_test_model(search={"do_sample": True, "temperature": 2.0, "top_k": 0, "random_seed": 8})
    p0 = long_prompt(20)
    job = [{"prompt": p0, "opts": {"max_generated_tokens": 8}},
           {"prompt": [4], "opts": {"max_generated_tokens": 8, "do_sample": False}},
           {"prompt": [5], "opts": {"max_generated_tokens": 8}}]
    res, _ = run_jobs([job, job], model=model)
    assert res[0] == res[1]
    seq = OracleSequence()
    seq.extend(p0 + res[0][0][0])
    assert res[0][1] == greedy_policy_turn(seq, [4], 8)
    # Turn 1 and 3 sample (model default): with temperature 2 over the whole vocabulary at least one
    # of them leaves the greedy path.
    plain = OracleSequence()
    g1 = plain.turn(p0, max_gen=8)
    assert res[0][0] != g1


# --------------------------------------------------------------------------------------------
# The random stream: Philox4x32-10 (src/base/random_stream.h), which device samplers reproduce
# --------------------------------------------------------------------------------------------
def _philox(lib, counter, key):
    import ctypes

    out = (ctypes.c_uint32 * 4)()
    lib.OgaExtPhilox4x32_10(ctypes.c_uint64(counter), ctypes.c_uint64(key), out)
    return list(out)


def _philox_reference(counter, key):
    """Philox4x32-10 written from the paper's definition, independently of the C++ code."""
    m = 0xFFFFFFFF
    c = [counter & m, counter >> 32, 0, 0]
    k = [key & m, key >> 32]
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & m, (k[1] + 0xBB67AE85) & m]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & m, (p0 >> 32) ^ c[3] ^ k[1], p0 & m]
    return c


def test_the_random_stream_is_philox4x32_10():
    import ctypes

    lib = ctypes.CDLL(og.library_path())
    lib.OgaExtPhilox4x32_10.restype = None
    lib.OgaExtPhilox4x32_10.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint32)]
    # Random123's known answer for a zero counter and key
    assert _philox(lib, 0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    for counter, key in ((1, 0), (0, 1), (2**32 + 5, 0xDEADBEEF_12345678), (2**64 - 1, 2**64 - 1), (77, 2**63)):
        assert _philox(lib, counter, key) == _philox_reference(counter, key)


def test_seeded_draws_follow_the_philox_stream():
    """A seeded turn with top_k 2 at a huge temperature picks between the two best tokens with
    probability ~1/2 each: the sampler walks candidates in index order (as the device sampler does),
    so draw n (Philox counter n of the turn's seed) < 1/2 picks the lower index. The whole stream is
    predicted from Philox and the test executor's logits, independently of the engine."""
    from helpers import OracleSequence, scores

    prompt = [5, 9, 13]
    steps = 24

    def draw(seed, n):
        w = _philox_reference(n, seed)
        return ((w[0] << 21) | (w[1] >> 11)) / 2.0**53

    # a seed whose draws all stay clear of the 1/2 boundary (weights differ from 1/2 by < 1e-3)
    seed = next(s for s in range(100, 200) if all(abs(draw(s, n) - 0.5) > 0.01 for n in range(steps)))
    seq = OracleSequence()
    seq.extend(prompt)
    expected = []
    for n in range(steps):
        sc = scores(seq.state, VOCAB)
        best, second = sorted(range(VOCAB), key=lambda v: (-sc[v], v))[:2]
        token = min(best, second) if draw(seed, n) < 0.5 else max(best, second)
        if token in seq.eos:
            break
        seq.append(token)
        expected.append(token)
    model = ogt.create_test_model(vocab_size=VOCAB, context_length=64)
    engine = og.Engine(model)
    request = engine.create_request()
    request.begin_turn(prompt, apply_options(request, sampled(seed=seed, temperature=1e4, top_k=2, max_gen=steps)))
    buffer = engine.create_event_buffer(8)
    tokens = []
    while engine.has_pending_requests():
        tokens += [e.token for e in engine.run(buffer) if int(e.flags) & TOKEN]
    assert tokens == expected
    assert len(set(expected)) > 2  # the draws went both ways along the way
