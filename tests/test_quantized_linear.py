"""oga.QuantizedLinear (ortops/quantized_linear.h): a block-quantized weight in MatMulNBits' layout
(GGUF Q4_0 / Q4_1 / Q8_0 blocks as quantize.from_gguf repacks them, round-to-nearest 4 and 8 bits,
block sizes above 32) in a one-node ONNX Runtime session, against numpy computing with the same
dequantized weight and the same int8 activations; each row the same bits alone and in any batch, and
the same on every code path (portable, AVX2, AVX-VNNI, AVX512-VNNI); the errors it reports."""
import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oga import ortops
from oga.models import quantize as qz

ROWS = (1, 2, 3, 7, 16, 64)


def _library():
    return ortops.library()


def _cpu_flags():
    try:
        return set(open("/proc/cpuinfo").read().split())
    except OSError:
        return set()


def _available_maths():
    flags = _cpu_flags()
    maths = ["portable"]
    if {"avx2", "fma", "f16c"} <= flags:
        maths.append("avx2")
        if "avx_vnni" in flags:
            maths.append("avx-vnni")
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"} <= flags:
            maths.append("avx512-vnni")
    return maths


@pytest.fixture
def force_math():
    """force_math(name) runs the operator with those loops until the test ends."""
    lib = _library()

    def force(name):
        assert lib.OgaOrtOpsSetQuantizedLinearMath(name.encode()) == 1, name
        assert ortops.quantized_linear_math() == name

    yield force
    lib.OgaOrtOpsSetQuantizedLinearMath(None)


def _session(q: qz.BlockQuantized, threads=2, name="linear", constant=True):
    inputs = ["x", "codes", "scales", "zero_points" if q.zero_points is not None else "",
              "offsets" if q.offsets is not None else ""]
    while inputs[-1] == "":
        inputs.pop()
    node = helper.make_node("QuantizedLinear", inputs, ["y"], name=name, domain="oga", K=q.k, N=q.n, bits=q.bits,
                            block_size=q.block_size)
    tensors = [numpy_helper.from_array(q.packed_codes(), "codes"), numpy_helper.from_array(q.flat_scales(), "scales")]
    if q.zero_points is not None:
        tensors.append(numpy_helper.from_array(q.packed_zero_points(), "zero_points"))
    if q.offsets is not None:
        tensors.append(numpy_helper.from_array(np.ascontiguousarray(q.offsets.T).astype(np.float16), "offsets"))
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["R", "K"])]
    if not constant:   # the weight as graph inputs: refused
        graph_inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in tensors]
        tensors = []
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                        ["R", q.n])],
                              initializer=tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("oga", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    ortops.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _quantized_activations(x):
    """(qx, dx): x [rows, k] as the operator quantizes it, int8 codes per block of 32 and a scale each."""
    rows, k = x.shape
    blocks = x.reshape(rows, k // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=2)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    qx = np.rint(blocks * inv[:, :, None])
    return qx, (amax / np.float32(127)).astype(np.float32)


def _reference(q: qz.BlockQuantized, x):
    """float64 y = sum over blocks of dx * (dequantized weight . qx)."""
    qx, dx = _quantized_activations(x)
    w = q.dequantize().astype(np.float64).reshape(q.n, q.k // 32, 32)
    per_block = np.einsum("rbi,nbi->rnb", qx.astype(np.float64), w)
    return (per_block * dx[:, None, :].astype(np.float64)).sum(axis=2)


def _gguf(type_name, n, k, rng):
    """A random GGUF tensor of that type, repacked as the builder repacks it."""
    blocks = n * k // 32
    d = (rng.uniform(0.002, 0.02, blocks)).astype(np.float16)
    if type_name == "Q8_0":
        raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), rng.integers(0, 256, (blocks, 32), dtype=np.uint8)],
                             axis=1)
    elif type_name == "Q4_0":
        raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), rng.integers(0, 256, (blocks, 16), dtype=np.uint8)],
                             axis=1)
    else:
        m = (-rng.uniform(0.0, 0.15, blocks)).astype(np.float16)
        raw = np.concatenate([d.view(np.uint8).reshape(-1, 2), m.view(np.uint8).reshape(-1, 2),
                              rng.integers(0, 256, (blocks, 16), dtype=np.uint8)], axis=1)
    return qz.from_gguf(type_name, raw, n, k)


def _weight(kind, n, k, rng):
    if kind in ("Q4_0", "Q4_1", "Q8_0"):
        return _gguf(kind, n, k, rng)
    bits, block_size = {"rtn4": (4, 32), "rtn8": (8, 32), "rtn4-b64": (4, 64), "rtn8-b128": (8, 128)}[kind]
    return qz.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, bits, block_size)


# GGUF's three types, round-to-nearest at both widths with uint8 zero points (float32 scales), block
# sizes above 32; n not a multiple of 8, an odd number of blocks (k 96, 160)
CASES = [(kind, n, k) for kind in ("Q4_0", "Q4_1", "Q8_0", "rtn4", "rtn8")
         for n, k in ((37, 96), (64, 128), (200, 160))] + [("rtn4-b64", 37, 128), ("rtn8-b128", 21, 384)]


@pytest.mark.parametrize("kind, n, k", CASES)
def test_matches_the_reference_and_every_row_is_the_same_alone_and_in_any_batch(kind, n, k, force_math):
    rng = np.random.default_rng(zlib.crc32(f"{kind} {n} {k}".encode()))
    q = _weight(kind, n, k, rng)
    x = rng.standard_normal((max(ROWS), k)).astype(np.float32)
    x[5, :32] = 0.0                          # an all-zero block: dx 0
    session = _session(q)
    expected = _reference(q, x)
    results = {}
    for math in _available_maths():
        force_math(math)
        (together,) = session.run(None, {"x": x})
        scale = np.abs(x).max() * np.abs(q.dequantize()).max() * k
        assert np.abs(together - expected).max() <= 1e-6 * scale, math
        for count in ROWS:
            (part,) = session.run(None, {"x": x[:count]})
            np.testing.assert_array_equal(part, together[:count], err_msg=f"{math}, {count} rows")
        for r in (0, 5, 63):
            (alone,) = session.run(None, {"x": x[r:r + 1]})
            np.testing.assert_array_equal(alone, together[r:r + 1], err_msg=f"{math}, row {r}")
        results[math] = together
    for math, y in results.items():
        np.testing.assert_array_equal(y, results["portable"], err_msg=f"{math} against the portable loops")


def test_smollm2_shapes_on_one_and_many_threads(force_math):
    """SmolLM2's MLP shape, one thread and two: the thread split changes no bit."""
    rng = np.random.default_rng(3)
    q = _gguf("Q4_1", 1536, 576, rng)
    x = rng.standard_normal((16, 576)).astype(np.float32)
    one, two = _session(q, threads=1), _session(q, threads=2)
    for math in _available_maths():
        force_math(math)
        np.testing.assert_array_equal(one.run(None, {"x": x})[0], two.run(None, {"x": x})[0])


def test_leading_dimensions_and_empty_input():
    rng = np.random.default_rng(4)
    q = _weight("Q8_0", 24, 64, rng)
    session = _session(q)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    (flat,) = session.run(None, {"x": x})
    assert session.run(None, {"x": np.zeros((0, 64), np.float32)})[0].shape == (0, 24)
    # rank 3 [2, 3, K]: the same rows
    graph_x = x.reshape(2, 3, 64)
    node = helper.make_node("QuantizedLinear", ["x", "codes", "scales"], ["y"], domain="oga", K=64, N=24, bits=8,
                            block_size=32)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 24])],
                              initializer=[numpy_helper.from_array(q.packed_codes(), "codes"),
                                           numpy_helper.from_array(q.flat_scales(), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("oga", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    ortops.register(options)
    s3 = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(s3.run(None, {"x": graph_x})[0].reshape(6, 24), flat)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_non_finite_activations_give_nan_rows_on_every_path(kind, force_math):
    rng = np.random.default_rng(5)
    q = _weight(kind, 16, 64, rng)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 40] = np.inf
    session = _session(q)
    results = []
    for math in _available_maths():
        force_math(math)
        (y,) = session.run(None, {"x": x})
        assert np.isnan(y[:2]).all() and np.isfinite(y[2]).all()
        results.append(y)
    for y in results[1:]:
        np.testing.assert_array_equal(y, results[0])


def test_errors_name_the_node_and_what_is_wrong():
    rng = np.random.default_rng(6)
    q = _weight("Q4_0", 16, 64, rng)
    session = _session(q, name="proj")
    with pytest.raises(Exception, match=r"oga\.QuantizedLinear node 'proj': x \[2, 32\] must have K = 64"):
        session.run(None, {"x": np.zeros((2, 32), np.float32)})
    with pytest.raises(Exception, match=r"oga\.QuantizedLinear node 'proj': codes must be a constant initializer"):
        _session(q, name="proj", constant=False)
    bad = qz.BlockQuantized(4, 16, 16, 64, np.zeros((16, 4, 16), np.uint8), np.ones((16, 4), np.float32), None,
                            None, "rtn")
    with pytest.raises(Exception, match=r"oga\.QuantizedLinear node 'proj': block_size must be a multiple of 32, "
                                        r"got 16"):
        _session(bad, name="proj")


def test_the_loops_can_be_forced_and_released():
    lib = _library()
    best = lib.OgaOrtOpsQuantizedLinearMath().decode()
    assert best == _available_maths()[-1]
    assert lib.OgaOrtOpsSetQuantizedLinearMath(b"no-such-loops") == 0
    assert lib.OgaOrtOpsQuantizedLinearMath().decode() == best
    lib.OgaOrtOpsSetPortable(1)
    try:
        assert lib.OgaOrtOpsQuantizedLinearMath().decode() == "portable"
    finally:
        lib.OgaOrtOpsSetPortable(0)
    assert lib.OgaOrtOpsQuantizedLinearMath().decode() == best


# ------------------------------------------------------------------------------------------------
# The norm and activation before the linear (inputs skip / gamma, attribute activation)

def _fused_graph(q, mode, separate):
    """mode "norm": RMSNorm(x + skip) * gamma then the linear, with the sum as a second output;
    "swiglu": SiLU(gate) * up then the linear. `separate`: oga.SkipRMSNorm / oga.SwiGlu nodes before a
    plain QuantizedLinear (the graph before fusion)."""
    value = helper.make_tensor_value_info
    attributes = dict(K=q.k, N=q.n, bits=q.bits, block_size=q.block_size)
    weight = ["codes", "scales", "zero_points" if q.zero_points is not None else "",
              "offsets" if q.offsets is not None else ""]
    tensors = [numpy_helper.from_array(q.packed_codes(), "codes"), numpy_helper.from_array(q.flat_scales(), "scales")]
    if q.zero_points is not None:
        tensors.append(numpy_helper.from_array(q.packed_zero_points(), "zero_points"))
    if q.offsets is not None:
        tensors.append(numpy_helper.from_array(np.ascontiguousarray(q.offsets.T).astype(np.float16), "offsets"))
    outputs = [value("y", TensorProto.FLOAT, ["R", q.n])]
    if mode == "norm":
        inputs = [value("x", TensorProto.FLOAT, ["R", "K"]), value("skip", TensorProto.FLOAT, ["S", "K"])]
        tensors.append(numpy_helper.from_array(np.linspace(0.5, 1.5, q.k).astype(np.float32), "gamma"))
        outputs.append(value("sum", TensorProto.FLOAT, ["R", q.k]))
        if separate:
            nodes = [helper.make_node("SkipRMSNorm", ["x", "skip", "gamma"], ["normed", "sum"], domain="oga",
                                      epsilon=1e-5),
                     helper.make_node("QuantizedLinear", ["normed"] + weight, ["y"], domain="oga", **attributes)]
        else:
            nodes = [helper.make_node("QuantizedLinear", ["x"] + weight + ["skip", "gamma"], ["y", "sum"],
                                      domain="oga", epsilon=1e-5, **attributes)]
    else:
        inputs = [value("x", TensorProto.FLOAT, ["R", "W"])]
        if separate:
            nodes = [helper.make_node("SwiGlu", ["x"], ["act"], domain="oga"),
                     helper.make_node("QuantizedLinear", ["act"] + weight, ["y"], domain="oga", **attributes)]
        else:
            nodes = [helper.make_node("QuantizedLinear", ["x"] + weight, ["y"], domain="oga", activation=1,
                                      **attributes)]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=tensors),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("oga", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    ortops.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("mode", ["norm", "swiglu"])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_norm_and_the_activation_inside_give_the_bits_of_the_separate_nodes(mode, kind, force_math):
    rng = np.random.default_rng(zlib.crc32(f"{mode} {kind}".encode()))
    q = _weight(kind, 40, 96, rng)
    width = q.k if mode == "norm" else 2 * q.k
    feeds = {"x": rng.standard_normal((max(ROWS), width)).astype(np.float32)}
    if mode == "norm":
        feeds["skip"] = rng.standard_normal((max(ROWS), q.k)).astype(np.float32)
    fused, separate = _fused_graph(q, mode, False), _fused_graph(q, mode, True)
    lib = _library()
    for portable in (0, 1):
        lib.OgaOrtOpsSetPortable(portable)
        try:
            for math in (["portable"] if portable else _available_maths()):
                force_math(math)
                together = fused.run(None, feeds)
                for got, want in zip(together, separate.run(None, feeds)):
                    np.testing.assert_array_equal(got, want, err_msg=f"{math}, portable rows {portable}")
                for count in ROWS:
                    part = fused.run(None, {name: v[:count] for name, v in feeds.items()})
                    for got, want in zip(part, together):
                        np.testing.assert_array_equal(got, want[:count], err_msg=f"{math}, {count} rows")
        finally:
            lib.OgaOrtOpsSetPortable(0)


def test_norm_and_activation_errors():
    rng = np.random.default_rng(8)
    q = _weight("Q4_0", 16, 64, rng)
    swiglu = _fused_graph(q, "swiglu", False)
    with pytest.raises(Exception, match=r"x \[2, 64\] must have 2K = 128 as its last dimension"):
        swiglu.run(None, {"x": np.zeros((2, 64), np.float32)})
    norm = _fused_graph(q, "norm", False)
    with pytest.raises(Exception, match=r"skip \[2, 64\] must have x's shape \[3, 64\]"):
        norm.run(None, {"x": np.zeros((3, 64), np.float32), "skip": np.zeros((2, 64), np.float32)})
    node = helper.make_node("QuantizedLinear", ["x", "codes", "scales", "", "", "skip"], ["y"], name="lin",
                            domain="oga", K=64, N=16, bits=4, block_size=32)
    value = helper.make_tensor_value_info
    graph = helper.make_graph([node], "g", [value("x", TensorProto.FLOAT, ["R", 64]),
                                            value("skip", TensorProto.FLOAT, ["R", 64])],
                              [value("y", TensorProto.FLOAT, ["R", 16])],
                              initializer=[numpy_helper.from_array(q.packed_codes(), "codes"),
                                           numpy_helper.from_array(q.flat_scales(), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("oga", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    ortops.register(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match=r"oga\.QuantizedLinear node 'lin': skip needs gamma"):
        session.run(None, {"x": np.zeros((2, 64), np.float32), "skip": np.zeros((2, 64), np.float32)})
    node = helper.make_node("QuantizedLinear", ["x", "codes", "scales"], ["y", "sum"], name="lin", domain="oga",
                            K=64, N=16, bits=4, block_size=32)
    graph = helper.make_graph([node], "g", [value("x", TensorProto.FLOAT, ["R", 64])],
                              [value("y", TensorProto.FLOAT, ["R", 16]), value("sum", TensorProto.FLOAT, ["R", 64])],
                              initializer=[numpy_helper.from_array(q.packed_codes(), "codes"),
                                           numpy_helper.from_array(q.flat_scales(), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("oga", 1)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match=r"oga\.QuantizedLinear node 'lin': the sum output needs gamma"):
        session.run(None, {"x": np.zeros((2, 64), np.float32)})
