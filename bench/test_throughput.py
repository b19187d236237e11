"""End-to-end throughput, oga vs onnxruntime_genai 0.18's Engine on the same model directory in the
same run (python -m pytest bench/test_throughput.py --benchmark-only -s).

Workloads: (a) 32 concurrent requests, prompts of 16..512 tokens, 32..256 new tokens each;
(b) one request. Models: SmolLM2-135M-Instruct (CPU fp32 build of the GGUF) and a small random
Llama. Each prints tokens/s for both engines and the ratio, and checks both produced the same
tokens (greedy, so any difference is a bug)."""
import numpy as np
import pytest

import oga
from oga import executor as executors
from oga import testing
from oga.models.spec import DecoderSpec

from workloads import cached_model_dir, compare_with_onnxruntime_genai, mixed_prompts, smollm2_gguf

SMALL = DecoderSpec(
    architecture="llama", vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
    num_kv_heads=4, head_dim=32, rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-5, context_length=1024,
    tie_word_embeddings=True, qkv_bias=False, sliding_window=None, bos_token_id=1, eos_token_ids=[2],
    pad_token_id=0)

MODELS = {
    "smollm2": lambda: cached_model_dir("smollm2-cpu-b32", dict(
        source=smollm2_gguf(), context_length=1024, block_size=16, num_blocks=1600, max_batch_size=32,
        max_scheduled_tokens=512)),
    "random-small": lambda: cached_model_dir("random-small-b32", dict(
        source=None, random_spec=SMALL, context_length=1024, block_size=16, num_blocks=1600, max_batch_size=32,
        max_scheduled_tokens=512)),
}


def _workload(kind, vocab_size):
    if kind == "32-requests":
        return mixed_prompts(vocab_size)
    rng = np.random.default_rng(1)
    return [rng.integers(3, vocab_size, size=128, dtype=np.int32)], [128]


@pytest.mark.parametrize("kind", ["32-requests", "1-request"])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_throughput_vs_onnxruntime_genai(benchmark, model_name, kind):
    vocab = 49152 if model_name == "smollm2" else SMALL.vocab_size
    prompts, budgets = _workload(kind, vocab)
    compare_with_onnxruntime_genai(benchmark, f"{model_name} {kind}", MODELS[model_name](), prompts, budgets)


def test_engine_overhead_per_step_on_smollm2(benchmark):
    """Step wall time minus time inside session.run, as a fraction of the step (goal < 3%)."""
    model_dir = MODELS["smollm2"]()
    prompts, budgets = mixed_prompts(49152, count=16)
    before = set(map(id, executors.OnnxEngineExecutor.live))
    engine = oga.Engine(oga.Model(model_dir))
    [executor] = [e for e in executors.OnnxEngineExecutor.live if id(e) not in before]
    for prompt, budget in zip(prompts, budgets):
        request = engine.create_request()
        options = oga.TurnOptions(request)
        options.set_max_generated_tokens(min(budget, 64))
        request.begin_turn(prompt, options)
    buffer = engine.create_event_buffer(64)

    def drain():
        while engine.has_pending_requests():
            engine.run(buffer)

    benchmark.pedantic(drain, rounds=1, iterations=1)
    counters = testing.engine_counters(engine)
    fraction = 1.0 - executor.session_run_ns / counters["step_ns"]
    benchmark.extra_info.update(engine_overhead_fraction=fraction, steps=counters["committed_steps"])
    print(f"\nengine overhead per step on SmolLM2: {100 * fraction:.2f}% over {counters['committed_steps']} steps "
          f"({(counters['step_ns'] - executor.session_run_ns) / counters['committed_steps'] / 1000:.1f} us/step)")
    assert fraction < 0.03
