"""Shared test helpers: an independent Python oracle of the built-in test executor, and drivers that
run an engine until it is idle while checking invariants after every Run and recording events as
plain tuples.

The oracle is written from the token rule in notes/python_api.md ("The test executor's token rule"),
not from the C++ code, so a packing, block-table, commit or rollback bug in the core shows up as a
token mismatch here.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

import oga as og
import oga.testing as ogt

# --------------------------------------------------------------------------------------------
# Oracle of the test executor's greedy token rule
# --------------------------------------------------------------------------------------------
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
STATE_INIT = 0x6F6761

TOKEN = 1
TURN_FINISHED = 2
CAPACITY_BLOCKED = 4
FAILED = 8
RETRYABLE = 16

R_NONE, R_EOS, R_STOP, R_MAX_GEN, R_MAX_SESSION, R_CANCELLED, R_FAILED = range(7)
E_NONE, E_DEFERRED, E_EXEC_CAPACITY, E_RETRYABLE, E_UNSERVICEABLE, E_CONTRACT, E_EXECUTION = range(7)


def mix64(x: int) -> int:
    x &= MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def next_state(prev: int, token: int, position: int) -> int:
    return mix64(prev ^ ((token * GOLDEN) & MASK64) ^ ((position << 32) & MASK64))


_VG_CACHE: Dict[int, np.ndarray] = {}


def _vg(vocab: int) -> np.ndarray:
    arr = _VG_CACHE.get(vocab)
    if arr is None:
        arr = np.array([((v + 1) * GOLDEN) & MASK64 for v in range(vocab)], dtype=np.uint64)
        _VG_CACHE[vocab] = arr
    return arr


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return x


def scores(state: int, vocab: int) -> np.ndarray:
    """24-bit integer scores of every vocabulary entry for a logits row computed from `state`."""
    with np.errstate(over="ignore"):
        x = np.uint64(state) + _vg(vocab)
        return (_mix_np(x) >> np.uint64(40)).astype(np.int64)


def score_scalar(state: int, v: int) -> int:
    return mix64((state + (v + 1) * GOLDEN) & MASK64) >> 40


def logits(state: int, vocab: int) -> np.ndarray:
    return (scores(state, vocab).astype(np.float64) / float(1 << 24) * 8.0 - 4.0).astype(np.float32)


class OracleSequence:
    """One request's logical sequence as the test executor sees it."""

    def __init__(self, vocab: int = 64, eos=(1,), max_session: int = 128):
        self.vocab = vocab
        self.eos = frozenset([eos] if isinstance(eos, int) else eos)
        self.max_session = max_session
        self.tokens: List[int] = []
        self.state = STATE_INIT

    def clone(self) -> "OracleSequence":
        c = OracleSequence(self.vocab, self.eos, self.max_session)
        c.tokens = list(self.tokens)
        c.state = self.state
        return c

    def append(self, token: int) -> None:
        self.state = next_state(self.state, int(token), len(self.tokens))
        self.tokens.append(int(token))

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(t)

    def greedy(self, mask_eos: bool = False) -> int:
        s = scores(self.state, self.vocab)
        if mask_eos:
            for e in self.eos:
                s[e] = -1
        return int(np.argmax(s))

    def fits(self, prompt_len: int) -> bool:
        return len(self.tokens) + prompt_len < self.max_session

    def turn(self, prompt: Sequence[int], max_gen: int = 0, min_gen: int = 0, stop_after: Optional[int] = None):
        """Runs one greedy turn. Returns (generated tokens, finish reason). With stop_after=n the turn
        is cut after n generated tokens (cancellation / failure) and the reason is None."""
        assert self.fits(len(prompt)), "turn does not fit the session cap"
        self.extend(prompt)
        out: List[int] = []
        while True:
            if stop_after is not None and len(out) >= stop_after:
                return out, None
            t = self.greedy(mask_eos=len(out) < min_gen)
            if t in self.eos:
                return out, R_EOS
            self.append(t)
            out.append(t)
            if max_gen and len(out) >= max_gen:
                return out, R_MAX_GEN
            if len(self.tokens) >= self.max_session:
                return out, R_MAX_SESSION


def oracle_turn(prompt, max_gen=0, min_gen=0, vocab=64, eos=(1,), max_session=128):
    return OracleSequence(vocab, eos, max_session).turn(prompt, max_gen, min_gen)


def expected_turn_events(turn_id: int, prompt_len: int, tokens: Sequence[int], reason: int):
    """Plain-tuple events (flags, turn_id, token, finish_reason, error_code, usage) of one turn that
    ends normally (one event per committed step)."""
    evs = []
    n = len(tokens)
    for i, t in enumerate(tokens):
        if i == n - 1 and reason != R_EOS:
            evs.append((TOKEN | TURN_FINISHED, turn_id, t, reason, E_NONE, (prompt_len, n, 0)))
        else:
            evs.append((TOKEN, turn_id, t, R_NONE, E_NONE, (0, 0, 0)))
    if reason == R_EOS:
        evs.append((TURN_FINISHED, turn_id, None, R_EOS, E_NONE, (prompt_len, n, 0)))
    return evs


def find_prompt(pred, length=3, vocab=64, eos=(1,), start=2, limit=200000):
    """Deterministically searches prompts [a, b, ...] (ids in [2, vocab)) satisfying pred(prompt)."""
    import itertools

    alphabet = range(start, vocab)
    count = 0
    for combo in itertools.product(alphabet, repeat=length):
        count += 1
        if count > limit:
            break
        if pred(list(combo)):
            return list(combo)
    raise AssertionError("no prompt satisfies the predicate")


def prompt_without_eos(n_tokens, length=3, vocab=64, eos=(1,), max_session=128, start=2, offset=0):
    """A prompt whose greedy continuation has at least n_tokens tokens before any EOS."""
    found = []

    def ok(p):
        toks, reason = OracleSequence(vocab, eos, max_session).turn(p, max_gen=n_tokens)
        return len(toks) == n_tokens

    def pred(p):
        if ok(p):
            found.append(p)
            return len(found) > offset
        return False

    return find_prompt(pred, length=length, vocab=vocab, eos=eos, start=start)


# --------------------------------------------------------------------------------------------
# Event snapshots
# --------------------------------------------------------------------------------------------
Ev = collections.namedtuple("Ev", "request flags turn_id token finish_reason error_code usage stop_index")


def snap(ev) -> Ev:
    u = ev.usage
    return Ev(
        ev.request,
        int(ev.flags),
        ev.turn_id,
        ev.token,
        int(ev.finish_reason),
        int(ev.error_code),
        (u.prompt_tokens, u.generated_tokens, u.cached_prompt_tokens),
        ev.matched_stop_string_index,
    )


def key(ev: Ev):
    return (ev.flags, ev.turn_id, ev.token, ev.finish_reason, ev.error_code, ev.usage)


def per_request(events: Sequence[Ev]):
    out: Dict[object, list] = collections.defaultdict(list)
    for e in events:
        out[e.request].append(key(e))
    return out


def counters(engine):
    return ogt.engine_counters(engine)


def run_once(engine, buffer, check=True) -> List[Ev]:
    """One Run; invariants checked afterwards; returns the delivered events as tuples."""
    result = engine.run(buffer)
    assert result is buffer
    if check:
        ogt.check_invariants(engine)
    return [snap(e) for e in result]


def drive(engine, buffer=None, capacity=64, max_runs=20000, check=True, stall_limit=64):
    """Runs until has_pending_requests() is False, checking invariants after every Run. Fails when
    the engine makes no progress (no event, no model run) for `stall_limit` consecutive Runs."""
    if buffer is None:
        buffer = engine.create_event_buffer(capacity)
    events: List[Ev] = []
    runs = 0
    stall = 0
    last_model_runs = counters(engine)["model_runs"]
    while engine.has_pending_requests():
        got = run_once(engine, buffer, check)
        events.extend(got)
        runs += 1
        assert runs < max_runs, "engine did not become idle"
        mr = counters(engine)["model_runs"]
        if not got and mr == last_model_runs:
            stall += 1
            assert stall < stall_limit, "engine stalled with pending work"
        else:
            stall = 0
        last_model_runs = mr
    return events


def make_engine(**cfg):
    model = ogt.create_test_model(**cfg)
    return model, og.Engine(model)


def turn_options(request, max_gen=0, min_gen=0):
    t = og.TurnOptions(request)
    if max_gen:
        t.set_max_generated_tokens(max_gen)
    if min_gen:
        t.set_min_generated_tokens(min_gen)
    return t


# --------------------------------------------------------------------------------------------
# Workloads: several jobs (requests), each with several turns, optionally staggered
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Turn:
    prompt: List[int]
    max_gen: int = 0
    min_gen: int = 0


@dataclasses.dataclass
class Job:
    turns: List[Turn]
    max_session: int = 0  # 0 = engine default
    start_run: int = 0  # begin the first turn once this many Runs happened


@dataclasses.dataclass
class WorkloadResult:
    per_job: List[list]  # plain-tuple events per job, in delivery order
    engine_events: List[tuple]  # request-less events as keys
    all_events: List[tuple]  # (job index or None, key) in delivery order
    counters: dict
    runs: int
    run_errors: List[str] = dataclasses.field(default_factory=list)


def default_session(model_cfg: dict) -> int:
    context = model_cfg.get("context_length", 128)
    max_length = model_cfg.get("max_length") or context
    num_blocks = model_cfg.get("num_blocks", 128)
    block_size = model_cfg.get("block_size", 4)
    mrl = min(context, num_blocks * block_size + 1) if num_blocks is not None else context
    return min(max_length, mrl)


def expected_workload(jobs: Sequence[Job], model_cfg: dict):
    """Oracle events per job (each job's turns run back to back)."""
    vocab = model_cfg.get("vocab_size", 64)
    eos = model_cfg.get("eos_token_id", 1)
    out = []
    for job in jobs:
        session = job.max_session or default_session(model_cfg)
        seq = OracleSequence(vocab, eos, session)
        evs = []
        for i, t in enumerate(job.turns):
            toks, reason = seq.turn(t.prompt, t.max_gen, t.min_gen)
            evs.extend(expected_turn_events(i + 1, len(t.prompt), toks, reason))
        out.append(evs)
    return out


def run_workload(model_cfg: dict, jobs: Sequence[Job], capacity: int = 64, fault=None, check=True,
                 max_runs=20000, stall_limit=64, allow_run_errors=False, setup=None) -> WorkloadResult:
    """Runs the jobs on a fresh engine. Each job's next turn begins as soon as its terminal event was
    delivered; a job is closed after its last turn. `fault` = dict of inject_fault kwargs; `setup`
    is called with the engine before the first Run."""
    model = ogt.create_test_model(**model_cfg)
    if fault is not None:
        ogt.inject_fault(model, **fault)
    engine = og.Engine(model)
    if setup is not None:
        setup(engine)
    buf = engine.create_event_buffer(capacity)
    n = len(jobs)
    reqs: List[Optional[object]] = [None] * n
    next_turn = [0] * n
    done = [False] * n
    per_job: List[list] = [[] for _ in range(n)]
    engine_events: List[tuple] = []
    all_events: List[tuple] = []
    runs = 0
    stall = 0
    run_errors: List[str] = []

    def begin(j):
        job = jobs[j]
        if reqs[j] is None:
            opts = og.RequestOptions()
            if job.max_session:
                opts.set_max_session_tokens(job.max_session)
            reqs[j] = engine.create_request(options=opts)
        t = job.turns[next_turn[j]]
        tid = reqs[j].begin_turn(t.prompt, turn_options(reqs[j], t.max_gen, t.min_gen))
        next_turn[j] += 1
        assert tid == next_turn[j]

    last_model_runs = 0
    while True:
        for j in range(n):
            if reqs[j] is None and not done[j] and jobs[j].start_run <= runs:
                begin(j)
        if not engine.has_pending_requests():
            waiting = [j for j in range(n) if reqs[j] is None and not done[j]]
            if not waiting:
                break
            runs = max(runs, min(jobs[j].start_run for j in waiting))
            continue
        try:
            got = run_once(engine, buf, check)
        except RuntimeError as exc:
            if not allow_run_errors:
                raise
            run_errors.append(str(exc))
            ogt.check_invariants(engine)
            got = []
        runs += 1
        assert runs < max_runs
        index = {id(r): j for j, r in enumerate(reqs) if r is not None}
        finished = []
        request_events = 0
        for e in got:
            if e.request is None:
                engine_events.append(key(e))
                all_events.append((None, key(e)))
                continue
            request_events += 1
            j = index[id(e.request)]
            per_job[j].append(key(e))
            all_events.append((j, key(e)))
            if e.flags & TURN_FINISHED:
                finished.append(j)
        del got
        for j in finished:
            if next_turn[j] < len(jobs[j].turns):
                begin(j)
            else:
                reqs[j].close()
                reqs[j] = None
                done[j] = True
        if check:
            ogt.check_invariants(engine)
        c = counters(engine)
        if c["model_runs"] == last_model_runs and not request_events:
            stall += 1
            assert stall < stall_limit, "workload stalled"
        else:
            stall = 0
        last_model_runs = c["model_runs"]
    c = counters(engine)
    return WorkloadResult(per_job, engine_events, all_events, c, runs, run_errors)


def subprocess_env():
    """The environment for a Python subprocess that must import the same oga as this test process
    (a source checkout shadows the installed package only when its directory is on sys.path)."""
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(og.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    return env
