"""oga.LogitsHead (ortops/logits_head.h) against the ONNX Gemm it replaces in the fused fp32 graph, side by
side in one process: SmolLM2-135M's LM head (49152 x 576, the tied embedding table, which a Gather also
reads, as in the model), 1 and 16 rows, ONNX Runtime's default intra-op threads for both sessions.
LogitsHead also writes each row's block maxima (greedy selection's input); goal: no slower than the Gemm
(asserted within 10%: the two runs share this machine's memory bandwidth with whatever else runs).
python -m pytest bench/test_logits_head.py -s"""
import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oga import ortops

VOCAB, HIDDEN, ROUNDS = 49152, 576, 30


def _session(weight, oga_head):
    value = helper.make_tensor_value_info
    outputs = [value("logits", TensorProto.FLOAT, ["R", VOCAB])]
    if oga_head:
        head = helper.make_node("LogitsHead", ["x", "weight"], ["logits", "maxima"], domain="oga")
        outputs.append(value("maxima", TensorProto.FLOAT, ["R", VOCAB // 1024]))
    else:
        head = helper.make_node("Gemm", ["x", "weight"], ["logits"], transB=1)
    embed = helper.make_node("Gather", ["weight", "ids"], ["embedded"], axis=0)
    graph = helper.make_graph([head, embed], "head", [value("x", TensorProto.FLOAT, ["R", HIDDEN]),
                                                      value("ids", TensorProto.INT64, ["N"])],
                              outputs + [value("embedded", TensorProto.FLOAT, ["N", HIDDEN])],
                              [numpy_helper.from_array(weight, "weight")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("oga", 1)])
    options = ort.SessionOptions()
    ortops.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _bound(session, x, oga_head):
    """The session's run over an IOBinding of preallocated outputs (as the executor binds them)."""
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_cpu_input("ids", np.array([1], np.int64))
    keep = [np.empty((len(x), VOCAB), np.float32), np.empty((1, HIDDEN), np.float32)]
    binding.bind_output("logits", "cpu", 0, np.float32, keep[0].shape, keep[0].ctypes.data)
    binding.bind_output("embedded", "cpu", 0, np.float32, keep[1].shape, keep[1].ctypes.data)
    if oga_head:
        keep.append(np.empty((len(x), VOCAB // 1024), np.float32))
        binding.bind_output("maxima", "cpu", 0, np.float32, keep[2].shape, keep[2].ctypes.data)
    return lambda: session.run_with_iobinding(binding), keep


@pytest.mark.parametrize("rows", [1, 16])
def test_logits_head_against_onnx_gemm(benchmark, rows):
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((VOCAB, HIDDEN)) * 0.05).astype(np.float32)
    x = rng.standard_normal((rows, HIDDEN)).astype(np.float32)
    runs = {}
    for name, oga_head in (("oga.LogitsHead", True), ("ONNX Gemm", False)):
        run, keep = _bound(_session(weight, oga_head), x, oga_head)
        run()
        runs[name] = (run, keep)
    np.testing.assert_allclose(runs["oga.LogitsHead"][1][0], runs["ONNX Gemm"][1][0], rtol=1e-4, atol=1e-4)
    times = {name: [] for name in runs}
    for _ in range(ROUNDS):  # interleaved, so both see the same machine
        for name, (run, _) in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    benchmark.pedantic(runs["oga.LogitsHead"][0], rounds=5, iterations=1)
    best = {name: min(t) * 1e3 for name, t in times.items()}
    median = {name: float(np.median(t)) * 1e3 for name, t in times.items()}
    ratio = best["oga.LogitsHead"] / best["ONNX Gemm"]
    benchmark.extra_info.update(best_ms=best, median_ms=median, ratio=ratio)
    print(f"\nLM head {rows} x {HIDDEN} -> {VOCAB}: " + ", ".join(
        f"{name} best {best[name]:.2f} ms (median {median[name]:.2f})" for name in runs) + f"; ratio {ratio:.2f}")
    assert ratio <= 1.10
