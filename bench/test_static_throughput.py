"""The static path, oga vs onnxruntime_genai 0.18's Engine on the same OGA-built (contiguous-cache)
SmolLM2 directory in the same run, for 4 and 16 concurrent requests (goal: oga at least as fast).
Both engines batch 4 rows per wave here (the directory keeps the default static batch size)."""
import numpy as np
import pytest

import oga

from test_static_vs_dynamic import _static_smollm2_dir
from workloads import run_engine


@pytest.mark.parametrize("requests", [4, 16])
def test_static_path_vs_onnxruntime_genai(benchmark, requests):
    import onnxruntime_genai as og18

    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 49152, size=int(n), dtype=np.int32) for n in np.linspace(16, 128, requests)]
    budgets = [64] * requests
    model_dir = _static_smollm2_dir()
    reference_tokens, reference_seconds, reference_streams = run_engine(og18, model_dir, prompts, budgets)
    result = {}

    def run_oga():
        result["run"] = run_engine(oga, model_dir, prompts, budgets)

    benchmark.pedantic(run_oga, rounds=1, iterations=1)
    tokens, seconds, streams = result["run"]
    assert tokens == reference_tokens == sum(budgets)
    assert streams == reference_streams
    ratio = (tokens / seconds) / (reference_tokens / reference_seconds)
    benchmark.extra_info.update(oga_tokens_per_s=tokens / seconds, ort_genai_tokens_per_s=reference_tokens / reference_seconds,
                                ratio=ratio)
    print(f"\nstatic path, {requests} requests: oga {tokens / seconds:.1f} tok/s, onnxruntime_genai 0.18 "
          f"{reference_tokens / reference_seconds:.1f} tok/s, ratio {ratio:.2f}")
