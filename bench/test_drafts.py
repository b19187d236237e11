"""Caller-supplied speculative drafts on SmolLM2 (CPU fp32, per-token logits): greedy decoding with
4 correct drafts per step vs plain greedy decoding, same model directory, same requests
(python -m pytest bench/test_drafts.py --benchmark-only -s).

(1) A plain greedy run records each request's tokens, the model runs and the wall time. (2) The same
requests on a fresh engine, where before every engine.run each decode-ready request is given the
next 4 tokens of its recorded plain stream as drafts: the streams must be identical, with far fewer
model runs and a higher tokens/s. EOS is not masked (drafts need a turn past its
min_generated_tokens), so a request may end before its budget; both runs end it at the same token.
Prints model runs per generated token, tokens/s both ways, their
ratio and the acceptance rate from get_speculative_stats."""
import time

import pytest

import oga
from oga import testing

from workloads import cached_model_dir, smollm2_gguf

DRAFTS = 4
PROMPT_TOKENS = 32

TEXTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press into a system that could",
    "To bake a simple loaf of bread at home you need flour, water, salt and yeast. First, mix the dry "
    "ingredients in a large bowl, then slowly add warm water while stirring until",
    "Photosynthesis is the process by which green plants, algae and some bacteria convert light energy "
    "into chemical energy. In the chloroplasts, chlorophyll absorbs sunlight and uses it to split water molecules,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number using an iterative loop.\"\"\"\n"
    "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\ndef",
]


def _model_dir():
    # Per-token logits: prefill logits are [num_tokens, 49152] float32, so prompts stay short.
    return cached_model_dir("smollm2-cpu-per-token-b8", dict(
        source=smollm2_gguf(), context_length=512, block_size=16, num_blocks=160, max_batch_size=8,
        max_scheduled_tokens=256, per_token_logits=True))


def _prompts(model_dir, count):
    tokenizer = oga.Tokenizer(oga.Model(model_dir))
    prompts = [[int(t) for t in tokenizer.encode(text)][:PROMPT_TOKENS] for text in TEXTS[:count]]
    assert all(len(p) == PROMPT_TOKENS for p in prompts)
    return prompts


class _Run:
    """One engine over `prompts`, each generating up to `budget` tokens. EOS is not masked:
    drafts require a turn past its min_generated_tokens, so both runs leave it at 0. With
    `expected` (the plain streams), each decode-ready request gets the next DRAFTS tokens of its
    stream as drafts before every engine.run. Model loading stays outside the timed part."""

    def __init__(self, model_dir, prompts, budget, expected=None):
        self.engine = oga.Engine(oga.Model(model_dir))
        self.prompts, self.budget, self.expected = prompts, budget, expected
        if expected is not None:
            assert self.engine.max_draft_tokens_per_proposal() >= DRAFTS

    def __call__(self):
        engine = self.engine
        before = testing.engine_counters(engine)
        start = time.perf_counter()
        requests = []  # held: a dropped Request is abandoned and reclaimed
        for prompt in self.prompts:
            request = engine.create_request()
            options = oga.TurnOptions(request)
            options.set_max_generated_tokens(self.budget)
            request.begin_turn(prompt, options)
            requests.append(request)
        index = {id(r): i for i, r in enumerate(requests)}
        tokens = [[] for _ in requests]
        finished = [False] * len(requests)
        buffer = engine.create_event_buffer(64)
        while engine.has_pending_requests():
            if self.expected is not None:
                for i, request in enumerate(requests):
                    if tokens[i] and not finished[i]:  # decode-ready: its prefill gave a token
                        drafts = self.expected[i][len(tokens[i]):len(tokens[i]) + DRAFTS]
                        if drafts:
                            request.set_draft_tokens(drafts)
            for event in engine.run(buffer):
                if event.request is None:
                    continue
                i = index[id(event.request)]
                if event.flags & oga.EngineEventFlags.TOKEN:
                    tokens[i].append(event.token)
                if event.flags & oga.EngineEventFlags.TURN_FINISHED:
                    finished[i] = True
        self.seconds = time.perf_counter() - start
        after = testing.engine_counters(engine)
        assert all(finished)
        self.tokens = tokens
        self.generated = sum(len(t) for t in tokens)
        self.model_runs = after["model_runs"] - before["model_runs"]
        self.step_ns = after["step_ns"] - before["step_ns"]
        self.executor_ns = after["executor_ns"] - before["executor_ns"]
        self.runs_per_token = self.model_runs / self.generated
        self.tokens_per_s = self.generated / self.seconds


@pytest.mark.parametrize("num_requests,budget", [(4, 96), (1, 128)], ids=["4-requests", "1-request"])
def test_correct_drafts_vs_plain_decoding_on_smollm2(benchmark, num_requests, budget):
    model_dir = _model_dir()
    prompts = _prompts(model_dir, num_requests)

    plain = _Run(model_dir, prompts, budget)
    plain()
    assert all(len(t) >= budget // 2 for t in plain.tokens)  # the prompts run to (about) the budget

    drafted = _Run(model_dir, prompts, budget, expected=plain.tokens)
    benchmark.pedantic(drafted, rounds=1, iterations=1)
    assert drafted.tokens == plain.tokens  # greedy verification never changes the stream

    stats = drafted.engine.get_speculative_stats()
    ratio = drafted.tokens_per_s / plain.tokens_per_s
    benchmark.extra_info.update(
        plain_model_runs_per_token=plain.runs_per_token, drafts_model_runs_per_token=drafted.runs_per_token,
        plain_model_runs=plain.model_runs, drafts_model_runs=drafted.model_runs,
        plain_tokens_per_s=plain.tokens_per_s, drafts_tokens_per_s=drafted.tokens_per_s, ratio=ratio,
        acceptance_rate=stats["acceptance_rate"],
        plain_executor_ms_per_run=plain.executor_ns / plain.model_runs / 1e6,
        drafts_executor_ms_per_run=drafted.executor_ns / drafted.model_runs / 1e6,
        plain_engine_share=1 - plain.executor_ns / plain.step_ns,
        drafts_engine_share=1 - drafted.executor_ns / drafted.step_ns)
    print(f"\nSmolLM2 {num_requests} request(s) x {budget} tokens, {DRAFTS} correct drafts per step:"
          f"\n  model runs per generated token: plain {plain.runs_per_token:.3f} ({plain.model_runs} runs), "
          f"drafts {drafted.runs_per_token:.3f} ({drafted.model_runs} runs)"
          f"\n  tokens/s: plain {plain.tokens_per_s:.1f}, drafts {drafted.tokens_per_s:.1f}, ratio {ratio:.2f}"
          f"\n  acceptance rate {stats['acceptance_rate']:.3f} ({stats['draft_tokens_accepted']}/"
          f"{stats['draft_tokens_evaluated']} drafts, {stats['rounds']} rounds)"
          f"\n  executor ms per model run: plain {plain.executor_ns / plain.model_runs / 1e6:.2f}, "
          f"drafts {drafted.executor_ns / drafted.model_runs / 1e6:.2f}; engine share of step time: "
          f"plain {100 * (1 - plain.executor_ns / plain.step_ns):.2f}%, "
          f"drafts {100 * (1 - drafted.executor_ns / drafted.step_ns):.2f}%")
    assert stats["acceptance_rate"] == 1.0
    assert drafted.runs_per_token <= 0.35
    # With 4 requests plain decoding is already at 1/4 run per token, so also compare with plain.
    assert drafted.model_runs <= 0.35 * plain.model_runs
    assert ratio > 1.0
