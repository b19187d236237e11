"""Device selection for ONNX Runtime sessions (issues 8 and 32): the providers of
model.decoder.session_options.provider_options (Config.append_provider / set_provider_option) are
checked when the model loads as onnxruntime-genai 0.18 checks them, with its texts (side by side
below); a cuda entry on a machine without a usable CUDA fails the load naming the reason, as 0.18's
"Cuda interface not available" does. Never a crash, never a silent CPU run of a CUDA request."""
import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

import oga as og
from helpers import subprocess_env
from oga import executor as executors
from oga.models import build
from oga.models.random_weights import tiny_spec


@pytest.fixture(scope="module")
def cpu_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cpu"))
    build(None, path, random_spec=tiny_spec(vocab_size=97, context_length=64), seed=1, block_size=4)
    return path


def _cuda_reason():
    import onnxruntime as ort

    reason = executors.cuda_unavailable_reason(ort)
    assert reason  # no GPU on this machine
    return reason


def test_a_cuda_decoder_without_cuda_names_the_reason(tmp_path):
    path = str(tmp_path / "cuda")
    build(None, path, target="cuda", random_spec=tiny_spec(vocab_size=97, context_length=64), seed=1)
    with pytest.raises(RuntimeError) as error:
        og.Model(path)
    assert str(error.value) == f"Cuda interface not available: {_cuda_reason()}"


def test_a_cpu_decoder_that_asks_for_cuda_is_refused_without_cuda(cpu_model, tmp_path):
    """In genai_config.json or through Config.append_provider, as 0.18 refuses it; the same config
    without the cuda entry loads."""
    path = str(tmp_path / "asks_cuda")
    shutil.copytree(cpu_model, path)
    config_path = os.path.join(path, "genai_config.json")
    config = json.load(open(config_path))
    config["model"]["decoder"].setdefault("session_options", {})["provider_options"] = [{"cuda": {}}]
    json.dump(config, open(config_path, "w"))
    expected = f"Cuda interface not available: {_cuda_reason()}"
    with pytest.raises(RuntimeError) as error:
        og.Model(path)
    assert str(error.value) == expected
    edited = og.Config(cpu_model)
    edited.append_provider("cuda")
    with pytest.raises(RuntimeError) as error:
        og.Model(edited)
    assert str(error.value) == expected
    cleared = og.Config(path)
    cleared.clear_providers()
    og.Engine(og.Model(cleared))


@pytest.fixture(scope="module")
def standard_model(tmp_path_factory):
    """A standard-op paged decoder, which onnxruntime_genai 0.18 loads too."""
    path = str(tmp_path_factory.mktemp("standard"))
    build(None, path, graph="standard", random_spec=tiny_spec(vocab_size=97, context_length=64), seed=1, block_size=4)
    return path


# Each case: Config edits after clear_providers(), (operation, provider[, key, value]) in order.
PROVIDER_CASES = [
    [],
    [("append", "cpu")], [("append", "CPU")], [("append", "CPUExecutionProvider")], [("append", "cpuExecutionProvider")],
    [("option", "cpu", "k", "v")], [("option", "CPU", "k", "v")],
    [("append", "bogus")], [("option", "bogus", "k", "v")], [("append", "rocm")], [("append", "TensorRT")],
    [("append", "cuda_execution_provider")], [("append", "azure")], [("append", "Js")],
    [("append", "xnnpack")], [("append", "coreml")], [("append", "migraphx")], [("append", "webnn")],
    [("append", "DML")], [("append", "dml")], [("append", "DmlExecutionProvider")],
    [("append", "QNN")], [("append", "qnn")], [("option", "QNNExecutionProvider", "k", "v")],
    [("append", "OpenVINO")], [("append", "openvino")], [("append", "WebGPU")], [("append", "webgpu")],
    [("append", "WebGpuExecutionProvider")], [("append", "VitisAI")], [("append", "vitisaiexecutionprovider")],
    [("append", "SNPE")], [("append", "SNPEExecutionProvider")], [("append", "XNNPACK")],
    [("append", "XnnpackExecutionProvider")], [("append", "WEBNN")], [("append", "JS")],
    [("append", "JsExecutionProvider")], [("append", "CoreML")], [("append", "MIGraphX")],
    [("append", "MIGraphXExecutionProvider")],
    [("append", "AZURE")], [("append", "AzureExecutionProvider")], [("option", "AZURE", "k", "v")],
    [("append", "AZURE"), ("append", "cpu")],
    [("append", "bogus"), ("append", "QNN")], [("append", "QNN"), ("append", "bogus")],
    [("append", "cpu"), ("append", "DML")],
]

# Refused by both, with 0.18's text naming its CUDA library where oga names the reason.
CUDA_CASES = [[("append", "cuda")], [("append", "CUDA")], [("append", "CUDAExecutionProvider")],
              [("option", "cuda", "device_id", "0")], [("append", "NvTensorRtRtx")],
              [("append", "nvtensorrtrtxexecutionprovider")], [("append", "cuda"), ("append", "bogus")]]

PROVIDER_PROBE = r"""
import json, sys
import onnxruntime_genai as og
out = []
directory, cases = json.load(sys.stdin)
for edits in cases:
    config = og.Config(directory)
    config.clear_providers()
    try:
        for operation, *arguments in edits:
            (config.append_provider if operation == "append" else config.set_provider_option)(*arguments)
        og.Model(config)
        out.append(None)
    except Exception as exc:
        out.append(str(exc))
print(json.dumps(out))
"""


def _ours(directory, edits):
    config = og.Config(directory)
    config.clear_providers()
    try:
        for operation, *arguments in edits:
            (config.append_provider if operation == "append" else config.set_provider_option)(*arguments)
        og.Model(config)
    except RuntimeError as error:
        return str(error)
    return None


def test_provider_checks_match_onnxruntime_genai(standard_model):
    """The same edits through onnxruntime_genai 0.18's og.Config / og.Model (in a subprocess) and
    oga's: the same outcome, the same text."""
    import onnxruntime_genai  # noqa: F401  (a test dependency: missing, it fails)
    cases = PROVIDER_CASES + CUDA_CASES
    theirs = json.loads(subprocess.run([sys.executable, "-c", PROVIDER_PROBE],
                                       input=json.dumps([standard_model, cases]), capture_output=True, text=True,
                                       check=True, timeout=300, env=subprocess_env()).stdout)
    ours = [_ours(standard_model, edits) for edits in cases]
    for edits, mine, reference in zip(PROVIDER_CASES, ours, theirs):
        assert mine == reference, edits
    reason = _cuda_reason()
    for edits, mine, reference in zip(CUDA_CASES, ours[len(PROVIDER_CASES):], theirs[len(PROVIDER_CASES):]):
        assert reference.startswith("Cuda interface not available: Failed to load library"), (edits, reference)
        assert mine == f"Cuda interface not available: {reason}", edits
    assert sum(m is None for m in ours) == 9  # no entry, the CPU entries without options, AZURE


def test_a_cpu_decoder_loads_without_warnings(cpu_model):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        og.Model(cpu_model)
