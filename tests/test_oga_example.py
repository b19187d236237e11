"""examples/engine_streaming.py, written for onnxruntime-genai 0.18's Engine API (Config, Model,
Tokenizer, Engine, TokenizerStream per request, requests joining a running batch), runs with
`import oga as og` and prints exactly what the same script prints under onnxruntime_genai 0.18 on
the same model directory (SmolLM2-135M-Instruct, greedy).
"""
import os
import subprocess
import sys

import pytest

from helpers import subprocess_env
from model_dirs import tiny_model_dir

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "engine_streaming.py")
ORIGINAL_IMPORT = "import oga as og\n"


def _run(script, *args):
    completed = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=subprocess_env(),
                               timeout=300)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


@pytest.fixture(scope="module")
def reference_script(tmp_path_factory):
    """The example with the one line a user of onnxruntime_genai would have written instead."""
    import onnxruntime_genai  # noqa: F401  (a test dependency: missing, it fails)
    with open(EXAMPLE, encoding="utf-8") as f:
        source = f.read()
    assert source.count(ORIGINAL_IMPORT) == 1
    code = source.split('"""', 2)[2]  # after the module docstring
    assert "oga" not in code.replace(ORIGINAL_IMPORT, ""), "the example may differ from 0.18 code only in its import"
    path = tmp_path_factory.mktemp("example") / "engine_streaming_onnxruntime_genai.py"
    path.write_text(source.replace(ORIGINAL_IMPORT, "import onnxruntime_genai as og\n"), encoding="utf-8")
    return str(path)


def test_example_matches_onnxruntime_genai_on_smollm2(smollm2_dir, reference_script):
    model_dir = smollm2_dir
    args = ["-m", model_dir, "-n", "6", "--initial", "3", "--max_new_tokens", "24"]
    got = _run(EXAMPLE, *args)
    expected = _run(reference_script, *args)
    assert got == expected
    assert got.count("\n[") + got.startswith("[") == 6
    assert "Paris" in got.split("[1]")[0]      # request 0: "What is the capital of France?"


def test_example_runs_on_a_random_model(tmp_path_factory):
    """More requests than batch rows, on a model whose tokens are arbitrary bytes."""
    model_dir = tiny_model_dir(tmp_path_factory)
    out = _run(EXAMPLE, "-m", model_dir, "-n", "12", "--initial", "5", "--max_new_tokens", "9")
    finished = [line for line in out.splitlines() if line.startswith("    -> ")]
    assert len(finished) == 12
    assert all("9 tokens" in line or "EOS" in line for line in finished)
