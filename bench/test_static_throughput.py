"""The static path, oga vs onnxruntime_genai 0.18's Engine on the same OGA-built (contiguous-cache)
SmolLM2 directory in the same run, for 4 and 16 concurrent requests (goal: oga at least as fast).
Both engines batch 4 rows per wave here (the directory keeps the default static batch size)."""
import numpy as np
import pytest

from test_static_vs_dynamic import _static_smollm2_dir
from workloads import compare_with_onnxruntime_genai


@pytest.mark.parametrize("requests", [4, 16])
def test_static_path_vs_onnxruntime_genai(benchmark, requests):
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 49152, size=int(n), dtype=np.int32) for n in np.linspace(16, 128, requests)]
    ratio = compare_with_onnxruntime_genai(benchmark, f"static path, {requests} requests", _static_smollm2_dir(), prompts,
                                   [64] * requests)
    assert ratio >= 1.0
