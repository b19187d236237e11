"""`oga convert` at real geometries: onnxruntime-genai 0.18's own int4 CPU build of a random-weight
Qwen2.5-0.5B and Gemma2-2B (the published configurations, weights drawn at random: only speed is
measured), run as built by 0.18 and, converted, by oga, 16 concurrent chats in the same run.

Goal (issue: continuous batching for every architecture): oga >= 2x 0.18's throughput and <= 0.3x its
median time to first token. Both engines generate exactly NEW_TOKENS per request (EOS masked), from
the same prompts; 0.18's directory keeps search.max_length = CONTEXT (it allocates that much cache per
request), except Gemma2's: 0.18 needs a cache of at least its window (4096) for the windowed layers.
0.18 cannot run Gemma2 prompts of different lengths in one batch (its padded batch fails in ONNX Runtime
on the windowed layers), so Gemma2's 16 prompts have one length; oga's converted directory runs
either. Greedy streams are reported, not compared: the graphs differ (paged vs contiguous) and int8
activations round differently."""
import json
import os
import statistics
import sys

import numpy as np
import pytest

from workloads import bench_cache_root, run_turns

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from architecture_models import write_tokenizer  # noqa: E402
from static_models import run_oga_builder, set_search_max_length  # noqa: E402

NEW_TOKENS = 64
CHATS = 16
CONTEXT = 512
RECIPE_VERSION = 2
PROMPT_LENGTHS = {"qwen2.5-0.5b": np.linspace(24, 72, CHATS), "gemma2-2b": [48] * CHATS}

GEOMETRIES = {
    "qwen2.5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM", "float32", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "gemma2-2b": ("Gemma2Config", "Gemma2ForCausalLM", "bfloat16", dict(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, max_position_embeddings=8192, sliding_window=4096,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        pad_token_id=0)),
}


def _checkpoint(name, directory):
    """The random checkpoint (transformers' own classes, seed 0) and a tokenizer beside it."""
    import torch
    import transformers

    config_class, model_class, dtype, fields = GEOMETRIES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**fields, torch_dtype=dtype)
    with torch.no_grad():
        model = getattr(transformers, model_class)(config).to(getattr(torch, dtype))
    model.save_pretrained(directory)
    write_tokenizer(directory)
    with open(os.path.join(directory, "config.json")) as f:
        written = json.load(f)
    written["architectures"] = [model_class]
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(written, f)


def original_and_converted(name):
    """0.18's int4 CPU build (search.max_length CONTEXT) and its oga conversion, built once per machine."""
    import shutil

    from oga.models import convert

    root = os.path.join(bench_cache_root(), f"{name}-geometry-v{RECIPE_VERSION}")
    original, converted = os.path.join(root, "ort-genai-int4"), os.path.join(root, "oga-converted")
    if not os.path.isfile(os.path.join(original, ".complete")):
        shutil.rmtree(root, ignore_errors=True)
        checkpoint = os.path.join(root, "checkpoint")
        os.makedirs(checkpoint)
        _checkpoint(name, checkpoint)
        run_oga_builder(checkpoint, original, precision="int4")
        set_search_max_length(original, max(CONTEXT, int(GEOMETRIES[name][3].get("sliding_window") or 0)))
        shutil.rmtree(checkpoint)
        open(os.path.join(original, ".complete"), "w").close()
    if not os.path.isfile(os.path.join(converted, "genai_config.json")):
        convert(original, converted, max_batch_size=CHATS, context_length=CONTEXT)
    return original, converted


def _prompts(name):
    rng = np.random.default_rng(7)
    vocab = GEOMETRIES[name][3]["vocab_size"]
    return [rng.integers(3, min(vocab, 30000), size=int(n), dtype=np.int32) for n in PROMPT_LENGTHS[name]]


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_sixteen_chats_converted_vs_onnxruntime_genai(benchmark, name):
    import onnxruntime_genai as og18

    import oga

    original, converted = original_and_converted(name)
    prompts = _prompts(name)
    results = {}

    def measure():
        results["oga (converted)"] = run_turns(oga, converted, prompts, NEW_TOKENS)
        results["onnxruntime-genai 0.18"] = run_turns(og18, original, prompts, NEW_TOKENS)

    benchmark.pedantic(measure, rounds=1, iterations=1)
    rates = {k: v[0] / v[1] for k, v in results.items()}
    ttfts = {k: statistics.median(v[2]) for k, v in results.items()}
    same = sum(a == b for a, b in zip(results["oga (converted)"][3], results["onnxruntime-genai 0.18"][3]))
    throughput = rates["oga (converted)"] / rates["onnxruntime-genai 0.18"]
    ttft = ttfts["oga (converted)"] / ttfts["onnxruntime-genai 0.18"]
    for engine in results:
        benchmark.extra_info[f"{engine} tokens/s"] = rates[engine]
        benchmark.extra_info[f"{engine} TTFT median ms"] = ttfts[engine] * 1e3
    benchmark.extra_info.update(throughput_ratio=throughput, ttft_ratio=ttft, identical_streams=same)
    print(f"\n{name} geometry, int4, {CHATS} chats x {NEW_TOKENS} tokens: "
          + ", ".join(f"{k} {rates[k]:.1f} tok/s TTFT {ttfts[k] * 1e3:.0f} ms" for k in results)
          + f"; throughput x{throughput:.2f}, TTFT x{ttft:.2f}; {same} of {CHATS} streams identical")
    assert all(v[0] == CHATS * NEW_TOKENS for v in results.values())
    assert throughput >= 2.0
    assert ttft <= 0.3
