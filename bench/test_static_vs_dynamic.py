"""Continuous batching vs static batching on a mixed workload: oga's dynamic engine on SmolLM2's
paged build vs onnxruntime_genai 0.18's static engine on OGA's own contiguous-cache CPU build of the
same weights (goal: oga at least 1.5x). 32 requests, prompts of 16..512 tokens, 16..256 new tokens
each (EOS masked, so both engines do the same work). Needs OGA's builder: torch==2.13.0,
transformers and onnx-ir (see tests/static_models.py)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from static_models import build_smollm2  # noqa: E402
from test_throughput import MODELS  # noqa: E402
from workloads import bench_cache_root, compare_with_onnxruntime_genai  # noqa: E402


def _static_smollm2_dir():
    return build_smollm2(os.path.join(bench_cache_root(), "smollm2-oga-builder-cpu-static"))   # built once per machine


def test_oga_dynamic_vs_onnxruntime_genai_static(benchmark):
    rng = np.random.default_rng(0)
    lengths = np.linspace(16, 512, 32).astype(int)
    budgets = [int(b) for b in np.linspace(16, 256, 32).astype(int)[::-1]]
    prompts = [rng.integers(3, 49152, size=n, dtype=np.int32) for n in lengths]
    # Different graphs (paged vs contiguous) of the same weights: fp32 sums may differ, tokens too.
    ratio = compare_with_onnxruntime_genai(benchmark, "oga dynamic vs onnxruntime_genai 0.18 static", MODELS["smollm2"](),
                                   prompts, budgets, ort_genai_dir=_static_smollm2_dir(), same_tokens=False)
    assert ratio >= 1.5
