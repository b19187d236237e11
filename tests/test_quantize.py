"""oga.models.quantize and linear_weights: GGUF Q4_0 / Q4_1 / Q8_0 blocks repacked into MatMulNBits form
without re-quantization (checked block by block against the gguf package's own dequantization and
through ONNX Runtime), round-to-nearest for everything else, and which form each weight takes."""
import gguf
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from oga.models import linear_weights as lw
from oga.models import quantize as qz


def _gguf(type_name, w):
    kind = getattr(gguf.GGMLQuantizationType, type_name)
    raw = gguf.quants.quantize(w, kind)
    return raw, gguf.quants.dequantize(raw, kind).reshape(w.shape)


def _weights(rng, n=24, k=96):
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[3, :32] = 0.75          # a flat block: Q4_1 stores it with d = 0
    w[5, 32:64] = 0.0         # an all-zero block
    w[7] *= 40.0              # a row of large values
    return w


@pytest.mark.parametrize("type_name, bits", [("Q4_0", 4), ("Q4_1", 4), ("Q8_0", 8)])
def test_gguf_blocks_repack_exactly(type_name, bits):
    w = _weights(np.random.default_rng(0))
    raw, expected = _gguf(type_name, w)
    blocks = qz.from_gguf(type_name, raw, *w.shape)
    assert (blocks.bits, blocks.block_size, blocks.n, blocks.k, blocks.source) == (bits, 32, 24, 96, type_name)
    got = blocks.dequantize()
    for row in range(w.shape[0]):                                  # block by block: every value exact
        for b in range(w.shape[1] // 32):
            assert np.array_equal(got[row, 32 * b:32 * b + 32], expected[row, 32 * b:32 * b + 32]), (row, b)
    assert blocks.codes.max() < 2 ** bits
    # the packed form MatMulNBits reads: element 2i in the low nibble of byte i
    packed = blocks.packed_codes()
    if bits == 4:
        assert packed.shape == (24, 3, 16)
        assert np.array_equal(packed[:, :, 0] & 0x0F, blocks.codes[:, :, 0])
        assert np.array_equal(packed[:, :, 0] >> 4, blocks.codes[:, :, 1])
    else:
        assert np.array_equal(packed, blocks.codes)
    assert (blocks.offsets is not None) == (type_name == "Q4_1")


def test_q4_1_keeps_its_fp16_minimum_as_the_block_offset():
    w = _weights(np.random.default_rng(1))
    raw, _ = _gguf("Q4_1", w)
    blocks = qz.from_gguf("Q4_1", raw, *w.shape)
    fields = raw.reshape(24, 3, 20)
    d = fields[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    m = fields[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)
    assert np.array_equal(blocks.scales, d) and np.array_equal(blocks.offsets, m)
    assert not blocks.zero_points.any()                            # w = d q + m: zero point 0
    assert np.array_equal(blocks.offsets.astype(np.float16).astype(np.float32), blocks.offsets)
    assert d[3, 0] == 0 and np.all(blocks.dequantize()[3, :32] == m[3, 0])   # the flat block


def _matmul_nbits_session(blocks, accuracy_level=0):
    inputs = ["A", "B", "S"]
    initializers = [numpy_helper.from_array(blocks.packed_codes(), "B"),
                    numpy_helper.from_array(blocks.flat_scales(), "S")]
    zero_points = blocks.packed_zero_points()
    if zero_points is not None:
        initializers.append(numpy_helper.from_array(zero_points, "Z"))
        inputs.append("Z")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=blocks.k, N=blocks.n,
                            bits=blocks.bits, block_size=32, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", blocks.k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", blocks.n])],
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_onnx_runtime_computes_with_the_gguf_weights(type_name):
    """MatMulNBits on the repacked codes (plus the block offsets, added as the graph adds them) is
    x @ W^T for the GGUF's own dequantized W, to float32 accuracy."""
    rng = np.random.default_rng(2)
    w = _weights(rng)
    raw, dequantized = _gguf(type_name, w)
    blocks = qz.from_gguf(type_name, raw, *w.shape)
    x = rng.standard_normal((5, w.shape[1])).astype(np.float32)
    y = _matmul_nbits_session(blocks).run(None, {"A": x})[0]
    if blocks.offsets is not None:
        y = y + x.reshape(5, -1, 32).sum(axis=2) @ blocks.offsets.T
    expected = x.astype(np.float64) @ dequantized.T.astype(np.float64)
    assert np.abs(y - expected).max() < 1e-5 * np.abs(expected).max()


def test_smollm2_tensors_repack_exactly(smollm2_gguf):
    """The real file: layer 0's Q4_1 tensors and the Q8_0 embedding, against gguf's dequantization."""
    reader = gguf.GGUFReader(smollm2_gguf)
    checked = 0
    for tensor in reader.tensors:
        if not (tensor.name.startswith("blk.0.") or tensor.name == "token_embd.weight"):
            continue
        if tensor.tensor_type.name not in qz.GGUF_EXACT_TYPES:
            continue
        k, n = (int(x) for x in tensor.shape)
        blocks = qz.from_gguf(tensor.tensor_type.name, np.asarray(tensor.data), n, k)
        expected = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type).reshape(n, k)
        assert np.array_equal(blocks.dequantize(), expected), tensor.name
        checked += 1
    assert checked == 8                                  # q, k, v, o, gate, up, down + the embedding


@pytest.fixture(scope="module")
def smollm2_gguf():
    from conftest import smollm2_gguf_path
    return smollm2_gguf_path()


def test_the_loader_keeps_exact_blocks_with_the_rope_row_order(smollm2_gguf):
    from static_models import load_gguf_weights

    loaded = load_gguf_weights(smollm2_gguf)                 # load_gguf(..., with_tokenizer=False), once a run
    assert set(loaded.blocks) == {n for n in loaded.weights if n.endswith("_proj.weight")} | {
        "model.embed_tokens.weight"}
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"):
        assert np.array_equal(loaded.blocks[name].dequantize(), loaded.weights[name]), name
    assert loaded.blocks["model.embed_tokens.weight"].bits == 8
    assert loaded.blocks["model.layers.3.mlp.up_proj.weight"].source == "Q4_1"


@pytest.mark.parametrize("bits", [4, 8])
def test_round_to_nearest(bits):
    rng = np.random.default_rng(3)
    w = _weights(rng)
    blocks = qz.quantize(w, bits)
    assert blocks.source == "rtn" and blocks.offsets is None and blocks.zero_points.dtype == np.uint8
    error = np.abs(blocks.dequantize() - w).reshape(24, 3, 32)
    assert np.all(error <= blocks.scales[:, :, None] * 0.5 + 1e-6)      # within half a step
    assert np.array_equal(blocks.dequantize()[5, 32:64], np.zeros(32, np.float32))   # zero stays zero
    x = rng.standard_normal((3, 96)).astype(np.float32)
    y = _matmul_nbits_session(blocks).run(None, {"A": x})[0]
    expected = x.astype(np.float64) @ blocks.dequantize().T.astype(np.float64)
    assert np.abs(y - expected).max() < 1e-5 * np.abs(expected).max()
    with pytest.raises(ValueError, match="not a multiple of the block size 32"):
        qz.quantize(np.zeros((2, 40), np.float32), bits)


def test_fused_rows_keep_each_parts_values():
    rng = np.random.default_rng(4)
    q1 = qz.from_gguf("Q4_1", _gguf("Q4_1", _weights(rng))[0], 24, 96)
    q0 = qz.from_gguf("Q4_0", _gguf("Q4_0", _weights(rng, n=8))[0], 8, 96)
    fused = qz.concat_rows([q1, q0])
    assert np.array_equal(fused.dequantize(), np.concatenate([q1.dequantize(), q0.dequantize()]))
    assert fused.offsets is not None and not fused.offsets[24:].any()
    with pytest.raises(ValueError, match="cannot fuse 8-bit"):
        qz.concat_rows([q1, qz.quantize(_weights(rng), 8)])


def test_which_form_each_weight_takes():
    rng = np.random.default_rng(5)
    w = _weights(rng)
    q4 = qz.from_gguf("Q4_1", _gguf("Q4_1", w)[0], 24, 96)
    q8 = qz.from_gguf("Q8_0", _gguf("Q8_0", w)[0], 24, 96)
    blocks = {"a": q4, "b": q8}
    assert lw.choose("a", w, blocks, None).quantized is q4              # the source's own blocks
    assert lw.choose("c", w, blocks, None).kind == "fp32"               # not quantized in the source
    assert lw.choose("a", w, blocks, "int4").quantized is q4
    assert lw.choose("b", w, blocks, "int4").quantized.source == "rtn"  # 8-bit source, 4-bit asked
    assert lw.choose("b", w, blocks, "int8").quantized is q8
    assert lw.choose("a", w, blocks, "int8").quantized.bits == 8
    assert lw.choose("a", w, blocks, "fp32").kind == "fp32"
    assert lw.choose("b", w, blocks, "int4", bits_override=8).quantized is q8   # the LM head
    odd = rng.standard_normal((4, 40)).astype(np.float32)
    assert lw.choose("d", odd, {}, "int4").kind == "fp32"               # k not a multiple of 32
    fused = lw.fuse("ab", [lw.choose("a", w, blocks, None), lw.choose("b", w, blocks, None)])
    assert len(fused) == 2                                              # 4-bit and 8-bit: kept apart
    with pytest.raises(ValueError, match="precision must be one of"):
        lw.check_precision("int3")
