"""`oga convert` on every decoder architecture onnxruntime-genai 0.18's builder emits for CPU (tiny
random checkpoints built by that builder in fp32 and int4: architecture_models.py): the converted
directory runs on oga's dynamic path and gives the greedy tokens 0.18's Generator gives on the
original directory.

Per architecture and precision, on one converted directory (chunk_size 16, so the windowed layers of
Gemma2 / Gemma3 / GPT-OSS keep their KV in a ring and prompts are prefilled in chunks):
- three prompts together in one engine (prompts of different lengths, which 0.18's padded batch
  cannot run on windowed layers): a short one, one past the sliding window and LongRoPE's switch, one
  that crosses the switch while it generates; then a continuation turn on the same requests (0.18's
  static path cannot continue a request: its Generator gets the whole history as a new prompt. Not for
  the prompt that crossed LongRoPE's switch: oga keeps the keys it computed before the switch, rotated
  by the short tables, as any KV cache does, while a new prompt past the switch rotates them all by
  the long ones);
- the same prompts on a pool too small for all of them at once (recompute preemption).
fp32 must give 0.18's tokens exactly. int4 (MatMulNBits with int8 activations, whose rounding differs
between a prefill and a decode of the same history) may differ only at a near-tie of the original
graph's logits (greedy_runs.equal_up_to_a_near_tie).
"""
import json
import os

import numpy as np
import pytest

import oga as og
from architecture_models import ARCHITECTURES, LONGROPE_ORIGINAL, VOCAB_SIZE, WINDOW, architecture_dir
from greedy_runs import begin_all, drain, equal_up_to_a_near_tie
from oga import testing
from oga.models import convert

CONVERTED = [(name, precision) for name, recipe in ARCHITECTURES.items() for precision in recipe.precisions]
MAX_NEW = 12
CONTINUATION = [11, 12, 13]
# The tiny int4 builds' logits spread over ~10-20; their int8 activation rounding moves them by
# hundredths (0.1 is the bound test_convert.py uses for the tiny Llama).
NEAR_TIE = 0.1


def _prompts():
    """A short prompt; one past the window and the LongRoPE switch; one that crosses the switch as it
    generates (its first token is predicted at length switch - 4)."""
    short = [5, 9, 13, 200, 7, 31, 64]
    long = [3 + (i * 37) % (VOCAB_SIZE - 3) for i in range(WINDOW + LONGROPE_ORIGINAL + 5)]
    crossing = [4 + (i * 53) % (VOCAB_SIZE - 4) for i in range(LONGROPE_ORIGINAL - 4)]
    return [short, long, crossing]


def _generator_018(model_dir, prompt, max_new):
    import onnxruntime_genai as og18

    model = og18.Model(str(model_dir))
    params = og18.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + max_new, do_sample=False)
    generator = og18.Generator(model, params)
    generator.append_tokens(np.asarray([prompt], np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def _original_logits(model_dir, history):
    """Last-token logits of 0.18's original graph for one history (0.18's Generator: it also feeds
    the windowed caches of Gemma2 / Gemma3 / GPT-OSS as their graphs want)."""
    import onnxruntime_genai as og18

    model = og18.Model(str(model_dir))
    params = og18.GeneratorParams(model)
    # the directory's own max_length (a windowed cache must hold the window)
    params.set_search_options(do_sample=False)
    generator = og18.Generator(model, params)
    generator.append_tokens(np.asarray([history], np.int32))
    return np.asarray(generator.get_logits(), np.float32).reshape(-1)


def _assert_same(model_dir, precision, prompts, want, have):
    if precision == "fp32":
        assert have == want
        return
    for prompt, w, h in zip(prompts, want, have):
        equal_up_to_a_near_tie(w, h, lambda done, p=prompt: _original_logits(model_dir, p + done), NEAR_TIE)


@pytest.fixture(scope="module")
def expected_018():
    """0.18's Generator on each original directory: first turns, then continuations."""
    cache = {}

    def expected(model_dir):
        if model_dir not in cache:
            first = [_generator_018(model_dir, p, MAX_NEW) for p in _prompts()]
            second = [_generator_018(model_dir, p + t + CONTINUATION, MAX_NEW) for p, t in zip(_prompts(), first)]
            cache[model_dir] = first, second
        return cache[model_dir]
    return expected


@pytest.mark.parametrize("name, precision", CONVERTED)
def test_converted_architecture_equals_018(tmp_path_factory, tmp_path, expected_018, name, precision):
    src = architecture_dir(tmp_path_factory, name, precision)
    dst = convert(src, tmp_path / "paged", max_batch_size=4, context_length=128, chunk_size=16)
    recipe = ARCHITECTURES[name]
    decoder = json.load(open(os.path.join(dst, "genai_config.json")))["model"]["decoder"]
    if recipe.sliding_window:       # the ring saves memory here: 2 blocks instead of 8 per request
        assert decoder["sliding_window"]["window_size"] == recipe.sliding_window
        assert "block_table_windowed" in decoder["inputs"]
    assert ("position_ids" in decoder["inputs"]) == recipe.has_position_ids
    first, second = expected_018(src)
    assert all(len(turn) == MAX_NEW for turn in first + second)   # no early EOS hiding a difference

    prompts = _prompts()
    engine = og.Engine(og.Model(str(dst)))
    requests = begin_all(og, engine, prompts, MAX_NEW)
    got_first = drain(og, engine, requests)
    _assert_same(src, precision, prompts, first, got_first)
    if got_first == first:     # the continuation compares only where the histories agree
        for request in requests:
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(MAX_NEW)
            request.begin_turn(CONTINUATION, options)
        got_second = drain(og, engine, requests)
        histories = [p + t + CONTINUATION for p, t in zip(prompts, first)]
        compared = slice(0, 2) if recipe.longrope_original_max else slice(0, 3)
        _assert_same(src, precision, histories[compared], second[compared], got_second[compared])


@pytest.mark.parametrize("name", [n for n, p in CONVERTED if p == "fp32"])
def test_converted_architecture_under_preemption(tmp_path_factory, tmp_path, expected_018, name):
    """A pool of 8 blocks of 16 holds the long request (5 blocks, and 2 of ring) but not all three
    (10, and 6 of ring): they run by recompute preemption, and every token is still 0.18's."""
    src = architecture_dir(tmp_path_factory, name, "fp32")
    dst = convert(src, tmp_path / "paged", max_batch_size=4, context_length=128, chunk_size=16, num_blocks=8)
    first, _ = expected_018(src)
    engine = og.Engine(og.Model(str(dst)))
    got = drain(og, engine, begin_all(og, engine, _prompts(), MAX_NEW))
    assert got == first
    assert testing.engine_counters(engine)["preemptions"] > 0


@pytest.mark.parametrize("name", [n for n, recipe in ARCHITECTURES.items() if recipe.has_conv_layers])
def test_converted_convolution_layers_with_prefix_caching(tmp_path_factory, tmp_path, name):
    """LFM2's short-convolution layers keep their state in the engine's fixed-state pool, so a
    request whose prompt shares whole blocks with an earlier one starts from the cached blocks and the
    convolution state checkpointed at their end (a prefill chunk ended there): its cached prompt tokens count, and its tokens are
    still 0.18's for the whole prompt."""
    src = architecture_dir(tmp_path_factory, name, "fp32")
    # steps of 16 tokens: prefill chunks end on block boundaries, where the engine checkpoints the state
    dst = convert(src, tmp_path / "paged", max_batch_size=4, context_length=128, max_scheduled_tokens=16)
    decoder = json.load(open(os.path.join(dst, "genai_config.json")))["model"]["decoder"]
    assert {"kind": "fixed_conv", "layer_ids": [0, 2]} in decoder["state_groups"]
    long = _prompts()[1]
    engine = og.Engine(og.Model(str(dst)))
    usages = []
    for prompt in (long, long[:32] + [7, 8, 9]):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(MAX_NEW)
        request.begin_turn(np.asarray(prompt, np.int32), options)
        tokens, buffer = [], engine.create_event_buffer(16)
        while engine.has_pending_requests():
            for event in engine.run(buffer):
                assert not event.flags & og.EngineEventFlags.FAILED, event.error_code
                if event.flags & og.EngineEventFlags.TOKEN:
                    tokens.append(event.token)
                usage = event.usage
                last_usage = (usage.prompt_tokens, usage.cached_prompt_tokens)
        usages.append(last_usage)
        assert tokens == _generator_018(src, prompt, MAX_NEW)
        request.close()
    assert usages[0] == (len(long), 0)
    assert usages[1] == (35, 32)     # two whole blocks of 16 came from the cache
