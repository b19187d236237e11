"""oga.QuantizedLinear (ortops/quantized_linear.h) against com.microsoft.MatMulNBits (accuracy_level 4: int8
activations, ONNX Runtime's fastest CPU kernels) on SmolLM2-135M's linear shapes, side by side in one process:
the same codes, scales and zero points (GGUF Q4_1 blocks, Q8_0 for the LM head, as SmolLM2 ships them), 1, 4,
16 and 64 rows, ONNX Runtime's default intra-op threads for both.

Each session holds `copies` nodes of one shape with different weights (at least ~24 MB of them, more than the
cores' L2), all reading the same x, so one run streams the weights as a decoder step does and the Python call
costs little per node. Timings are the best of interleaved runs (the machine is shared). Printed per shape and
row count: microseconds per node, the weight bytes each streamed per second, and that as a fraction of a copy
bandwidth measured in the same run (numpy copying a buffer of the model's size, bytes read + written).
MatMulNBits is given no Q4_1 offsets (the builder's graphs add them in the consuming operator), so it does a
little less work than QuantizedLinear here.

Then SmolLM2 end to end, before and after: oga's default build (the fused graph, GGUF Q4_1 / Q8_0 blocks) with its
quantized linears as MatMulNBits (the graph before oga.QuantizedLinear) and as oga.QuantizedLinear, in the same
run: the decode step at batch 1 and 16 straight through ONNX Runtime with the fraction of the copy bandwidth its
weight bytes per step reach, and the engine's tokens/s for 1 request and 16 chats (bench/workloads.py).

Goals asserted: at 16 and 64 rows QuantizedLinear is faster than MatMulNBits on every shape (int8 work, no
horizontal sums); at 1 and 4 rows, where both stream the weights, within 15% of it; end to end, the 16-chat rate
at least MatMulNBits' and the 1-request rate within 10% of it. python -m pytest bench/test_quantized_linear.py -s"""
import time

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oga import ortops
from oga.models import quantize as qz

# (name, N, K, GGUF type): q and o projections, k or v, the MLP's up (or gate) and down, the fused
# q|k|v and gate|up of oga's graph, the tied LM head
SHAPES = [("q/o 576x576", 576, 576, "Q4_1"), ("k/v 192x576", 192, 576, "Q4_1"),
          ("qkv 960x576", 960, 576, "Q4_1"), ("up 1536x576", 1536, 576, "Q4_1"),
          ("gate|up 3072x576", 3072, 576, "Q4_1"), ("down 576x1536", 576, 1536, "Q4_1"),
          ("head 49152x576", 49152, 576, "Q8_0")]
ROWS = (1, 4, 16, 64)
ROUNDS = 40
MIN_BYTES = 24 << 20


def _gguf(type_name, n, k, rng):
    blocks = n * k // 32
    d = rng.uniform(0.002, 0.02, blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if type_name == "Q8_0":
        return qz.from_gguf(type_name, np.concatenate([d, rng.integers(0, 256, (blocks, 32), np.uint8)], 1), n, k)
    m = (-rng.uniform(0, 0.15, blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return qz.from_gguf(type_name, np.concatenate([d, m, rng.integers(0, 256, (blocks, 16), np.uint8)], 1), n, k)


def _session(weights, oga_node):
    n, k = weights[0].n, weights[0].k
    nodes, tensors, outputs = [], [], []
    for i, q in enumerate(weights):
        names = [f"codes{i}", f"scales{i}"]
        tensors += [numpy_helper.from_array(q.packed_codes(), names[0]),
                    numpy_helper.from_array(q.flat_scales(), names[1])]
        if q.zero_points is not None:
            names.append(f"zero_points{i}")
            tensors.append(numpy_helper.from_array(q.packed_zero_points(), names[-1]))
        attributes = dict(K=k, N=n, bits=q.bits, block_size=q.block_size)
        if oga_node:
            if q.offsets is not None:
                names += [""] * (3 - len(names)) + [f"offsets{i}"]
                tensors.append(numpy_helper.from_array(q.offsets.T.astype(np.float16), names[-1]))
            nodes.append(helper.make_node("QuantizedLinear", ["x"] + names, [f"y{i}"], domain="oga", **attributes))
        else:
            nodes.append(helper.make_node("MatMulNBits", ["x"] + names, [f"y{i}"], domain="com.microsoft",
                                          accuracy_level=4, **attributes))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["R", n]))
    graph = helper.make_graph(nodes, "linears", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["R", k])],
                              outputs, initializer=tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("oga", 1),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    ortops.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _bound(session, x, n, copies):
    binding = session.io_binding()
    binding.bind_cpu_input("x", x)
    keep = [np.empty((len(x), n), np.float32) for _ in range(copies)]
    for i, out in enumerate(keep):
        binding.bind_output(f"y{i}", "cpu", 0, np.float32, out.shape, out.ctypes.data)
    return lambda: session.run_with_iobinding(binding), keep


def copy_bandwidth(nbytes=128 << 20, rounds=8):
    """Bytes read + written per second by numpy copying an nbytes buffer (best of `rounds`)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(rounds))
    return 2 * nbytes / best


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def bandwidth():
    value = copy_bandwidth()
    print(f"\ncopy bandwidth (numpy, 128 MB, read + written): {value / 1e9:.1f} GB/s")
    return value


@pytest.mark.parametrize("shape", SHAPES, ids=[s[0] for s in SHAPES])
def test_quantized_linear_against_matmulnbits(benchmark, bandwidth, shape):
    label, n, k, kind = shape
    rng = np.random.default_rng(n + k)
    one = _gguf(kind, n, k, rng)
    weight_bytes = one.codes.size * one.bits // 8 + one.scales.size * 2 * (2 if kind == "Q4_1" else 1)
    copies = int(min(64, max(2, -(-MIN_BYTES // weight_bytes))))
    weights = [one] + [_gguf(kind, n, k, rng) for _ in range(copies - 1)]
    sessions = {"oga.QuantizedLinear": _session(weights, True), "MatMulNBits": _session(weights, False)}
    lines, ratios = [], {}
    for rows in ROWS:
        x = rng.standard_normal((rows, k)).astype(np.float32)
        runs = {name: _bound(s, x, n, copies) for name, s in sessions.items()}
        for run, _ in runs.values():
            run()
        # the two agree to int8-activation accuracy (MatMulNBits quantizes x its own way, and has no offsets)
        if kind == "Q8_0":
            a, b = runs["oga.QuantizedLinear"][1][0], runs["MatMulNBits"][1][0]
            assert np.abs(a - b).max() <= 0.02 * np.abs(b).max()
        times = {name: [] for name in runs}
        for _ in range(ROUNDS):
            for name, (run, _) in runs.items():
                times[name].append(_timed(run) / copies)
        best = {name: min(t) for name, t in times.items()}
        ratios[rows] = best["oga.QuantizedLinear"] / best["MatMulNBits"]
        streamed = {name: weight_bytes / t for name, t in best.items()}
        lines.append(f"  {rows:3d} rows: " + "   ".join(
            f"{name} {best[name] * 1e6:8.1f} us {streamed[name] / 1e9:5.1f} GB/s ({streamed[name] / bandwidth:4.0%})"
            for name in runs) + f"   ratio {ratios[rows]:.2f}")
        benchmark.extra_info[f"{rows} rows us"] = {name: t * 1e6 for name, t in best.items()}
    benchmark.pedantic(runs["oga.QuantizedLinear"][0], rounds=3, iterations=1)
    print(f"\n{label} ({kind}, {weight_bytes / 1e6:.2f} MB, {copies} copies):\n" + "\n".join(lines))
    for rows in (16, 64):
        assert ratios[rows] < 1.0, (label, rows, ratios[rows])
    for rows in (1, 4):
        assert ratios[rows] <= 1.15, (label, rows, ratios[rows])


# ---- SmolLM2 end to end --------------------------------------------------------------------------

def _smollm2_dirs(monkeypatch):
    """{graph: model directory}: oga's default SmolLM2 build with its quantized linears as MatMulNBits
    (at accuracy_level 4, as before oga.QuantizedLinear) and as QuantizedLinear."""
    from oga.models import linear_weights as lw
    from workloads import cached_model_dir, smollm2_gguf

    kwargs = dict(source=smollm2_gguf(), graph="fused", context_length=1024, max_batch_size=16, num_blocks=1100,
                  max_scheduled_tokens=512)
    dirs = {"oga.QuantizedLinear": cached_model_dir("smollm2-cpu-fused-gguf-blocks-c1024", kwargs)}
    with monkeypatch.context() as patch:
        patch.setattr(lw, "OGA_LINEAR_ACCURACY_LEVEL", None)   # no level matches: MatMulNBits everywhere
        dirs["MatMulNBits"] = cached_model_dir("smollm2-cpu-fused-gguf-blocks-matmulnbits-c1024", kwargs)
    return dirs


def _weight_bytes(model_dir):
    """Bytes of linear weights a decode step reads: MatMulNBits' initializers as they are (codes, float32
    scales, zero points) plus the block offsets its consumers add; for QuantizedLinear its packed form,
    the codes with float16 scale and offset per block (GGUF's own sizes; the zero points are folded in).
    The embedding table is not counted: a step gathers a few rows of it."""
    import onnx

    model = onnx.load(f"{model_dir}/model.onnx", load_external_data=True)
    sizes = {t.name: numpy_helper.to_array(t).nbytes for t in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            total += sum(sizes[name] for name in node.input[1:] if name)
        elif node.op_type == "QuantizedLinear":
            n = next(a.i for a in node.attribute if a.name == "N")
            k = next(a.i for a in node.attribute if a.name == "K")
            bits = next(a.i for a in node.attribute if a.name == "bits")
            total += n * k * bits // 8 + n * (k // 32) * 2 * 2
        if node.domain == "oga" and node.op_type != "QuantizedLinear":
            total += sum(sizes[name] for name in node.input if name.endswith(".block_offsets"))
    return total


def test_smollm2_before_and_after(benchmark, bandwidth, monkeypatch):
    import step_timing
    from workloads import chat_prompts, run_turns

    import oga

    dirs = _smollm2_dirs(monkeypatch)
    step = {name: {} for name in dirs}
    for batch in (1, 16):
        for _ in range(3):   # interleaved, best of
            for name, model_dir in dirs.items():
                ms = step_timing.paged_decode_ms(model_dir, batch, 128, reps=10)
                step[name][batch] = min(step[name].get(batch, 1e9), ms)
    rates = {name: {} for name in dirs}
    prompts = {count: chat_prompts(f"{dirs['MatMulNBits']}/tokenizer.json", count) for count in (1, 16)}
    holder = {}

    def measure():
        for count in (1, 16):
            for _ in range(2):
                for name, model_dir in dirs.items():
                    tokens, seconds, _, streams = run_turns(oga, model_dir, prompts[count], 64)
                    rates[name][count] = max(rates[name].get(count, 0.0), tokens / seconds)
                    holder[name, count] = streams

    benchmark.pedantic(measure, rounds=1, iterations=1)
    lines = []
    for name, model_dir in dirs.items():
        weights = _weight_bytes(model_dir)
        fraction = weights / (step[name][1] / 1e3) / bandwidth
        lines.append(f"  {name:20s} decode step batch 1 {step[name][1]:6.2f} ms ({weights / 1e6:.0f} MB of weights: "
                     f"{fraction:4.0%} of the copy bandwidth), batch 16 {step[name][16]:6.2f} ms;  "
                     f"1 request {rates[name][1]:6.1f} tok/s, 16 chats {rates[name][16]:6.1f} tok/s")
        benchmark.extra_info[name] = dict(step_ms=step[name], tokens_per_s=rates[name], bandwidth_fraction=fraction)
    print("\nSmolLM2 (GGUF Q4_1 / Q8_0 blocks, fused graph), 64 new tokens a request:\n" + "\n".join(lines))
    after, before = rates["oga.QuantizedLinear"], rates["MatMulNBits"]
    assert after[16] >= before[16], (after, before)
    assert after[1] >= 0.9 * before[1], (after, before)
