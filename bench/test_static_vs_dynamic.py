"""Continuous batching vs static batching on a mixed workload: oga's dynamic engine on SmolLM2's
paged build vs onnxruntime_genai 0.18's static engine on OGA's own contiguous-cache CPU build of the
same weights (goal: oga at least 1.5x). 32 requests, prompts of 16..512 tokens, 16..256 new tokens
each (EOS masked, so both engines do the same work). Needs OGA's builder: torch==2.13.0,
transformers and onnx-ir (see tests/static_models.py)."""
import os
import sys

import numpy as np

import oga

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from static_models import build_smollm2  # noqa: E402
from test_throughput import MODELS  # noqa: E402
from workloads import run_engine  # noqa: E402


def _static_smollm2_dir():
    root = os.environ.get("OGA_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "oga", "bench"))
    out = os.path.join(root, "smollm2-oga-builder-cpu-static")
    if not os.path.isfile(os.path.join(out, ".complete")):
        build_smollm2(out)
        open(os.path.join(out, ".complete"), "w").close()
    return out


def test_oga_dynamic_vs_onnxruntime_genai_static(benchmark):
    import onnxruntime_genai as og18

    rng = np.random.default_rng(0)
    lengths = np.linspace(16, 512, 32).astype(int)
    budgets = [int(b) for b in np.linspace(16, 256, 32).astype(int)[::-1]]
    prompts = [rng.integers(3, 49152, size=n, dtype=np.int32) for n in lengths]
    static_tokens, static_seconds, _ = run_engine(og18, _static_smollm2_dir(), prompts, budgets)
    result = {}

    def run_oga():
        result["run"] = run_engine(oga, MODELS["smollm2"](), prompts, budgets)

    benchmark.pedantic(run_oga, rounds=1, iterations=1)
    tokens, seconds, _ = result["run"]
    assert tokens == static_tokens == sum(budgets)
    ratio = (tokens / seconds) / (static_tokens / static_seconds)
    benchmark.extra_info.update(oga_dynamic_tokens_per_s=tokens / seconds,
                                ort_genai_static_tokens_per_s=static_tokens / static_seconds, ratio=ratio)
    print(f"\noga dynamic {tokens / seconds:.1f} tok/s vs onnxruntime_genai 0.18 static "
          f"{static_tokens / static_seconds:.1f} tok/s: ratio {ratio:.2f}")
