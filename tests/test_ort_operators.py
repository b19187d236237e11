"""oga's ONNX Runtime operators (ortops/, loaded as oga.ortops): each one in a one-node ONNX Runtime
session against numpy written from the definitions, with the AVX2 loops and with the portable ones,
plus the errors they report and the in-place cache contract."""
import os
import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from oga import ortops


@pytest.fixture(params=["vector", "portable"])
def math(request):
    """Runs the test with the CPU's vector loops, then with the portable ones forced."""
    lib = ortops.library()
    lib.OgaOrtOpsSetPortable(1 if request.param == "portable" else 0)
    yield ortops.math_kind()
    lib.OgaOrtOpsSetPortable(0)


def _cpu_has_avx2():
    try:
        flags = open("/proc/cpuinfo").read().split()
    except OSError:
        return False
    return {"avx2", "fma", "f16c"} <= set(flags)


def _session(nodes, inputs, outputs, initializers=(), threads=2):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("oga", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    ortops.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _value(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def test_the_library_registers_the_oga_domain_and_picks_its_loops():
    lib = ortops.library()
    assert lib.OgaOrtOpsDomain() == b"oga" == ortops.DOMAIN.encode()
    assert lib.OgaOrtOpsApiVersion() == 17
    assert ortops.math_kind() == ("avx2" if _cpu_has_avx2() else "portable")
    assert os.path.isfile(ortops.library_path())


# ------------------------------------------------------------------------------------------------
# PagedGroupQueryAttention

def _attention_session(heads, kv_heads, head_dim, block_size, packed=True, rotary=True, window=-1, interleaved=0,
                       offsets=False, threads=2, name="attention", fixed_cache_shape=True, half_cache=False,
                       softcap=0.0, sink=False, rope_switch=0):
    inputs = [_value("query", TensorProto.FLOAT, ["N", "W"])]
    names = ["query", "", ""]
    if not packed:
        inputs += [_value("key", TensorProto.FLOAT, ["N", kv_heads * head_dim]),
                   _value("value", TensorProto.FLOAT, ["N", kv_heads * head_dim])]
        names = ["query", "key", "value"]
    cache = ["blocks", block_size, kv_heads, head_dim] if fixed_cache_shape else ["blocks", "size", "heads", "dim"]
    cache_type = TensorProto.FLOAT16 if half_cache else TensorProto.FLOAT
    inputs += [_value(n, cache_type, cache) for n in ("kc", "vc")]
    inputs += [_value("table", TensorProto.INT32, ["B", "M"]), _value("cu", TensorProto.INT32, ["B1"]),
               _value("past", TensorProto.INT32, ["B"])]
    names += ["kc", "vc", "table", "cu", "past"]
    if rotary or offsets or sink or rope_switch:
        inputs += [_value("cos", TensorProto.FLOAT, ["P", "R"]), _value("sin", TensorProto.FLOAT, ["P", "R"])]
        names += ["cos", "sin"] if rotary else ["", ""]
    if offsets or sink or rope_switch:
        inputs += [_value("offset_input", TensorProto.FLOAT, ["N", "K"]),
                   _value("offset_weights", TensorProto.FLOAT16, ["KB", "W"])] if offsets else []
        names += ["offset_input", "offset_weights"] if offsets else ["", ""]
    if sink or rope_switch:
        inputs += [_value("sink", TensorProto.FLOAT, [heads])] if sink else []
        names.append("sink" if sink else "")
    if rope_switch:
        inputs += [_value("cos_long", TensorProto.FLOAT, ["P", "R"]), _value("sin_long", TensorProto.FLOAT, ["P", "R"])]
        names += ["cos_long", "sin_long"]
    node = helper.make_node("PagedGroupQueryAttention", names, ["out", "pk", "pv"], name=name, domain="oga",
                            num_heads=heads, kv_num_heads=kv_heads, do_rotary=int(rotary),
                            local_window_size=window, rotary_interleaved=interleaved, softcap=float(softcap),
                            rope_switch_length=int(rope_switch))
    outputs = [_value("out", TensorProto.FLOAT, ["N", heads * head_dim])] + [
        _value(n, cache_type, cache) for n in ("pk", "pv")]
    return _session([node], inputs, outputs, threads=threads)


def _rope(x, positions, cos, sin, interleaved):
    half = cos.shape[1]
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]
    x = x.copy()
    if interleaved:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half], x[..., half:2 * half] = a * c - b * s, b * c + a * s
    return x


def _attention_reference(q, k, v, key_cache, value_cache, table, cu, past, cos, sin, heads, kv_heads, window,
                         interleaved, softcap=0.0, sink=None, long_rope=None):
    """Token t of row r at position p = past[r] + t - cu[r] writes its (rotated) key and value to
    block table[r][p // block_size], slot p % block_size, then attends to positions 0..p of its row
    (the last `window` of them when windowed), in float64; scores capped by softcap * tanh(s /
    softcap), and head h's sink logit in each softmax's denominator. long_rope (switch, cos, sin):
    the rows longer than `switch` after the step rotate with those tables."""
    key_cache, value_cache = key_cache.copy(), value_cache.copy()
    block_size, D = key_cache.shape[1], key_cache.shape[3]
    group = heads // kv_heads
    n = q.shape[0]
    q = q.reshape(n, heads, D).astype(np.float64)
    k, v = k.reshape(n, kv_heads, D), v.reshape(n, kv_heads, D)
    row_of = np.repeat(np.arange(len(past)), np.diff(cu))
    positions = past[row_of] + np.arange(n) - cu[row_of]
    if cos is not None:
        rotated_q, rotated_k = _rope(q, positions, cos, sin, interleaved), _rope(k, positions, cos, sin, interleaved)
        if long_rope is not None:
            switch, cos_long, sin_long = long_rope
            long_rows = (past + np.diff(cu) > switch)[row_of]
            rotated_q[long_rows] = _rope(q, positions, cos_long, sin_long, interleaved)[long_rows]
            rotated_k[long_rows] = _rope(k, positions, cos_long, sin_long, interleaved)[long_rows]
        q, k = rotated_q, rotated_k
    k, v = k.astype(key_cache.dtype), v.astype(value_cache.dtype)        # a float16 cache rounds them
    for t in range(n):
        r, p = row_of[t], positions[t]
        key_cache[table[r, p // block_size], p % block_size] = k[t]
        value_cache[table[r, p // block_size], p % block_size] = v[t]
    out = np.zeros((n, heads, D))
    for t in range(n):
        r, p = row_of[t], positions[t]
        seen = np.arange(max(0, p - window + 1) if window > 0 else 0, p + 1)
        keys = np.stack([key_cache[table[r, x // block_size], x % block_size] for x in seen]).astype(np.float64)
        values = np.stack([value_cache[table[r, x // block_size], x % block_size] for x in seen]).astype(np.float64)
        for h in range(heads):
            scores = keys[:, h // group] @ q[t, h] / np.sqrt(D)
            if softcap:
                scores = softcap * np.tanh(scores / softcap)
            top = scores.max() if sink is None else max(scores.max(), sink[h])
            weights = np.exp(scores - top)
            denominator = weights.sum() + (0.0 if sink is None else np.exp(sink[h] - top))
            out[t, h] = (weights / denominator) @ values[:, h // group]
    return out.reshape(n, heads * D), key_cache, value_cache


def _attention_case(rng, heads, kv_heads, D, block_size, query_lengths, pasts, packed=True, rotary=True, window=-1,
                    interleaved=0, alias=True, offsets=False, threads=2, half_cache=False, softcap=0.0, sink=None,
                    rotary_dims=None, rope_switch=0):
    session = _attention_session(heads, kv_heads, D, block_size, packed, rotary, window, interleaved, offsets,
                                 threads, half_cache=half_cache, softcap=softcap, sink=sink is not None,
                                 rope_switch=rope_switch)
    cache_dtype = np.float16 if half_cache else np.float32
    cu = np.concatenate([[0], np.cumsum(query_lengths)]).astype(np.int32)
    n = int(cu[-1])
    past = np.asarray(pasts, np.int32)
    columns = max(-(-(p + q) // block_size) for p, q in zip(pasts, query_lengths)) + 1
    num_blocks = len(pasts) * columns + 3
    table = rng.permutation(num_blocks)[:len(pasts) * columns].reshape(len(pasts), columns).astype(np.int32)
    key_cache = rng.standard_normal((num_blocks, block_size, kv_heads, D)).astype(cache_dtype)
    value_cache = rng.standard_normal((num_blocks, block_size, kv_heads, D)).astype(cache_dtype)
    q = rng.standard_normal((n, heads * D)).astype(np.float32)
    k = rng.standard_normal((n, kv_heads * D)).astype(np.float32)
    v = rng.standard_normal((n, kv_heads * D)).astype(np.float32)
    positions = max(p + q for p, q in zip(pasts, query_lengths)) + 5
    R = rotary_dims or D   # partial rotary: the first R dimensions rotate, the rest pass through
    angles = np.arange(positions)[:, None] / 10000.0 ** (np.arange(0, R, 2) / R)[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    feeds = {"table": table, "cu": cu, "past": past}
    if sink is not None:
        sink = np.asarray(sink, np.float32)
        feeds["sink"] = sink
    long_rope = None
    if rope_switch:
        long_angles = angles / 4.0 + 0.1      # any other table: the rows past the switch must use it
        long_rope = (rope_switch, np.cos(long_angles).astype(np.float32), np.sin(long_angles).astype(np.float32))
        feeds.update(cos_long=long_rope[1], sin_long=long_rope[2])
    if packed:
        feeds["query"] = np.concatenate([q, k, v], axis=1)
    else:
        feeds.update(query=q, key=k, value=v)
    if rotary or offsets:
        feeds.update(cos=cos, sin=sin)
    if offsets:
        width = (heads + 2 * kv_heads) * D
        x = rng.standard_normal((n, 64)).astype(np.float32)
        weights = rng.standard_normal((2, width)).astype(np.float16)
        feeds.update(offset_input=x, offset_weights=weights)
        corrected = feeds["query"] + x.reshape(n, 2, 32).sum(axis=2) @ weights.astype(np.float32)
        q, k, v = np.split(corrected, [heads * D, (heads + kv_heads) * D], axis=1)
    expected, expected_k, expected_v = _attention_reference(
        q, k, v, key_cache, value_cache, table, cu, past, cos if rotary else None, sin, heads, kv_heads, window,
        interleaved, softcap, sink, long_rope)
    kc, vc = key_cache.copy(), value_cache.copy()
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    binding.bind_cpu_input("kc", kc)
    binding.bind_cpu_input("vc", vc)
    out = np.zeros((n, heads * D), np.float32)
    binding.bind_output("out", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    copies = ortops.cache_copies()
    if alias:
        binding.bind_output("pk", "cpu", 0, cache_dtype, list(kc.shape), kc.ctypes.data)
        binding.bind_output("pv", "cpu", 0, cache_dtype, list(vc.shape), vc.ctypes.data)
        session.run_with_iobinding(binding)
        present_k, present_v = kc, vc
        assert ortops.cache_copies() == copies                # updated in place
    else:
        binding.bind_output("pk")
        binding.bind_output("pv")
        session.run_with_iobinding(binding)
        _, present_k, present_v = [o.numpy() for o in binding.get_outputs()]
        assert np.array_equal(kc, key_cache) and np.array_equal(vc, value_cache)   # inputs untouched
        assert ortops.cache_copies() == copies + 2            # a whole-cache copy each, and counted
    assert np.abs(out - expected).max() < 2e-4
    # keys are rotated in float32 (a fused multiply-add may round the last bit apart from numpy's;
    # in a float16 cache that can be one float16 step, ~1e-3 relative)
    key_tolerance = 2e-3 * np.abs(expected_k.astype(np.float32)).max() if half_cache else 1e-5
    assert np.abs(present_k.astype(np.float32) - expected_k.astype(np.float32)).max() <= key_tolerance
    if offsets:   # the corrected values are summed in another order than numpy's
        assert np.abs(present_v.astype(np.float32) - expected_v.astype(np.float32)).max() < (2e-3 if half_cache else 1e-5)
    else:         # values are stored as they are (float16: rounded to nearest even, as numpy does)
        assert np.array_equal(present_v, expected_v)


ATTENTION_CASES = {
    "one-token": dict(heads=9, kv_heads=3, D=64, block_size=16, query_lengths=[1], pasts=[0]),
    "decodes": dict(heads=9, kv_heads=3, D=64, block_size=16, query_lengths=[1, 1, 1], pasts=[5, 100, 600]),
    "prefill": dict(heads=9, kv_heads=3, D=64, block_size=16, query_lengths=[37], pasts=[0]),
    "mixed": dict(heads=9, kv_heads=3, D=64, block_size=16, query_lengths=[5, 1, 20, 1], pasts=[30, 300, 17, 0]),
    # one decoding row over several key chunks (partial sums merged) beside a long prefill
    "long-decode": dict(heads=6, kv_heads=3, D=64, block_size=16, query_lengths=[1, 40, 1], pasts=[2000, 10, 700]),
    "separate-kv": dict(heads=4, kv_heads=2, D=16, block_size=4, query_lengths=[3, 1, 9], pasts=[2, 7, 0],
                        packed=False),
    "head-dim-12": dict(heads=4, kv_heads=4, D=12, block_size=5, query_lengths=[3, 1, 9], pasts=[2, 7, 0]),
    "group-8-heads-16": dict(heads=16, kv_heads=2, D=32, block_size=8, query_lengths=[1, 17], pasts=[90, 3]),
    "window": dict(heads=8, kv_heads=2, D=32, block_size=8, query_lengths=[7, 1, 19], pasts=[40, 90, 3], window=10),
    "window-long": dict(heads=6, kv_heads=3, D=64, block_size=16, query_lengths=[1, 30], pasts=[2000, 700],
                        window=300),
    "interleaved-rotary": dict(heads=8, kv_heads=2, D=32, block_size=8, query_lengths=[7, 1], pasts=[40, 90],
                               interleaved=1),
    "no-rotary": dict(heads=8, kv_heads=2, D=32, block_size=8, query_lengths=[7, 1, 19], pasts=[40, 90, 3],
                      rotary=False),
    "block-offsets": dict(heads=9, kv_heads=3, D=64, block_size=16, query_lengths=[5, 1], pasts=[30, 300],
                          offsets=True),
    "one-thread": dict(heads=9, kv_heads=3, D=64, block_size=16, query_lengths=[5, 1, 20], pasts=[30, 900, 17],
                       threads=1),
    "partial-rotary": dict(heads=8, kv_heads=2, D=64, block_size=8, query_lengths=[7, 1, 19], pasts=[40, 90, 3],
                           rotary_dims=48),
    "partial-interleaved": dict(heads=4, kv_heads=2, D=32, block_size=8, query_lengths=[7, 1], pasts=[40, 90],
                                interleaved=1, rotary_dims=16),
    "softcap": dict(heads=8, kv_heads=2, D=32, block_size=8, query_lengths=[7, 1, 19, 1], pasts=[40, 90, 3, 1500],
                    softcap=0.7),
    # sink logits above, within and below the scores' range; a long decode row merges key chunks
    "sink": dict(heads=4, kv_heads=2, D=32, block_size=8, query_lengths=[7, 1, 19, 1], pasts=[40, 90, 3, 1500],
                 sink=[9.0, 0.5, -0.3, -40.0]),
    # rows ending at, just past and far past the switch (past + tokens vs 45), prefill and decode
    "long-rope": dict(heads=4, kv_heads=2, D=32, block_size=8, query_lengths=[5, 1, 6, 1, 30],
                      pasts=[40, 44, 40, 45, 0], rope_switch=45),
    "long-rope-interleaved-partial": dict(heads=4, kv_heads=2, D=32, block_size=8, query_lengths=[5, 1, 6],
                                          pasts=[40, 44, 40], rope_switch=45, interleaved=1, rotary_dims=16),
    "sink-window-softcap": dict(heads=4, kv_heads=2, D=32, block_size=8, query_lengths=[7, 1, 19, 1],
                                pasts=[40, 90, 3, 1500], sink=[2.0, 0.5, -0.3, -4.0], window=12, softcap=1.5),
}


@pytest.mark.parametrize("cache", ["float32", "float16"])
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_matches_the_reference(math, case, cache):
    _attention_case(np.random.default_rng(zlib.crc32(case.encode())), half_cache=cache == "float16",
                    **ATTENTION_CASES[case])


@pytest.mark.parametrize("cache", ["float32", "float16"])
def test_attention_copies_the_cache_when_present_is_not_bound_to_past(cache):
    _attention_case(np.random.default_rng(1), 9, 3, 64, 16, [5, 1], [30, 300], alias=False,
                    half_cache=cache == "float16")



def _group_query_attention_session(heads, kv_heads, D, window, softcap, sink, interleaved):
    """ONNX Runtime's own com.microsoft.GroupQueryAttention over contiguous caches [1, kv_heads, past, D]."""
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_length", "cos", "sin"]
    inputs = [_value("query", TensorProto.FLOAT, [1, "S", heads * D]),
              _value("key", TensorProto.FLOAT, [1, "S", kv_heads * D]),
              _value("value", TensorProto.FLOAT, [1, "S", kv_heads * D]),
              _value("past_key", TensorProto.FLOAT, [1, kv_heads, "P", D]),
              _value("past_value", TensorProto.FLOAT, [1, kv_heads, "P", D]),
              _value("seqlens_k", TensorProto.INT32, [1]), _value("total_length", TensorProto.INT32, []),
              _value("cos", TensorProto.FLOAT, ["M", "R"]), _value("sin", TensorProto.FLOAT, ["M", "R"])]
    if sink is not None:
        names += ["", "", "sink"]
        inputs.append(_value("sink", TensorProto.FLOAT, [heads]))
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"],
                            domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, do_rotary=1,
                            rotary_interleaved=interleaved, local_window_size=window, softcap=float(softcap))
    outputs = [_value("out", TensorProto.FLOAT, [1, "S", heads * D]),
               _value("present_key", TensorProto.FLOAT, [1, kv_heads, "T", D]),
               _value("present_value", TensorProto.FLOAT, [1, kv_heads, "T", D])]
    graph = helper.make_graph([node], "gqa", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("window, softcap, sink, interleaved, rotary_dims", [
    (-1, 0.0, None, 0, 32), (5, 0.0, None, 0, 32), (5, 0.0, None, 0, 16), (-1, 0.8, None, 1, 32),
    (-1, 0.0, [3.0, 0.2, -0.5, -6.0], 0, 32), (6, 1.2, [1.0, 0.2, -0.5, -2.0], 1, 16)])
def test_attention_matches_onnx_runtime_group_query_attention(math, window, softcap, sink, interleaved, rotary_dims):
    """A converted graph must give the tokens ONNX Runtime's GroupQueryAttention gives: one sequence
    through both operators, a prompt then decode steps, with a window (local_window_size w: w keys in
    both), softcap, head sinks, interleaved and partial rotary."""
    heads, kv_heads, D, block_size = 4, 2, 32, 4
    rng = np.random.default_rng(window + 7 * int(softcap * 10) + rotary_dims)
    gqa = _group_query_attention_session(heads, kv_heads, D, window, softcap, sink, interleaved)
    paged = _attention_session(heads, kv_heads, D, block_size, packed=False, window=window,
                               interleaved=interleaved, softcap=softcap, sink=sink is not None)
    lengths = [9, 1, 1, 4, 1]
    total = sum(lengths)
    angles = np.arange(total + 4)[:, None] / 10000.0 ** (np.arange(0, rotary_dims, 2) / rotary_dims)[None, :]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    blocks = -(-total // block_size)
    table = rng.permutation(blocks + 2)[:blocks].reshape(1, blocks).astype(np.int32)
    kc = np.zeros((blocks + 2, block_size, kv_heads, D), np.float32)
    vc = np.zeros_like(kc)
    past_key = np.zeros((1, kv_heads, 0, D), np.float32)
    past_value = np.zeros_like(past_key)
    extra = {} if sink is None else {"sink": np.asarray(sink, np.float32)}
    done = 0
    for n in lengths:
        q = rng.standard_normal((n, heads * D)).astype(np.float32)
        k = rng.standard_normal((n, kv_heads * D)).astype(np.float32)
        v = rng.standard_normal((n, kv_heads * D)).astype(np.float32)
        expected, past_key, past_value = gqa.run(None, dict(
            query=q[None], key=k[None], value=v[None], past_key=past_key, past_value=past_value,
            seqlens_k=np.array([done + n - 1], np.int32), total_length=np.array(done + n, np.int32),
            cos=cos, sin=sin, **extra))
        out, kc, vc = paged.run(None, dict(query=q, key=k, value=v, kc=kc, vc=vc, table=table,
                                           cu=np.array([0, n], np.int32), past=np.array([done], np.int32),
                                           cos=cos, sin=sin, **extra))
        assert np.abs(out - expected[0]).max() < 1e-4, (done, n)
        done += n

def _run_attention(session, **feeds):
    return session.run(None, feeds)


def test_attention_errors_name_the_node_and_the_tensor():
    session = _attention_session(4, 2, 8, 4, name="layer3/attention", fixed_cache_shape=False)
    base = dict(query=np.zeros((3, 64), np.float32), kc=np.zeros((6, 4, 2, 8), np.float32),
                vc=np.zeros((6, 4, 2, 8), np.float32), table=np.array([[0, 1]], np.int32),
                cu=np.array([0, 3], np.int32), past=np.array([2], np.int32),
                cos=np.ones((16, 4), np.float32), sin=np.zeros((16, 4), np.float32))
    assert np.isfinite(_run_attention(session, **base)[0]).all()

    def fails(match, **changes):
        with pytest.raises(Exception, match=r"oga\.PagedGroupQueryAttention node 'layer3/attention': " + match):
            _run_attention(session, **{**base, **changes})

    fails(r"a packed query \[3, 60\] must be \[num_tokens, 64\]", query=np.zeros((3, 60), np.float32))
    fails(r"block_table\[0\]\[1\] = 6 is not a block of the 6-block cache", table=np.array([[0, 6]], np.int32))
    fails(r"row 0 reaches position 8, past its block_table's 2 columns", past=np.array([6], np.int32))
    fails(r"cumulative_sequence_lengths must end at num_tokens \(3\), got 2", cu=np.array([0, 2], np.int32))
    fails(r"past_sequence_lengths\[0\] is negative", past=np.array([-1], np.int32))
    fails(r"position 16 is past the 16 positions of cos_cache", past=np.array([14], np.int32),
          table=np.array([[0, 1, 2, 3, 4]], np.int32))
    fails(r"key_cache \[6, 4, 3, 8\] must have kv_num_heads \(2\) heads", kc=np.zeros((6, 4, 3, 8), np.float32),
          vc=np.zeros((6, 4, 3, 8), np.float32))
    fails(r"key_cache \[6, 4, 2, 8\] and value_cache \[5, 4, 2, 8\] differ", vc=np.zeros((5, 4, 2, 8), np.float32))
    with pytest.raises(Exception, match=r"oga\.PagedGroupQueryAttention node 'bad': num_heads \(3\) must be a "
                                        r"positive multiple of kv_num_heads \(2\)"):
        _attention_session(3, 2, 8, 4, name="bad")
    with pytest.raises(Exception, match=r"local_window_size must be -1 \(none\) or positive, got 0"):
        _attention_session(4, 2, 8, 4, window=0)


# ------------------------------------------------------------------------------------------------
# SkipRMSNorm and SwiGlu

def _block_offsets(x, weights):
    return x.reshape(x.shape[0], -1, 32).sum(axis=2).astype(np.float64) @ weights.astype(np.float64)


@pytest.mark.parametrize("skip, offsets", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("rows, width", [(1, 576), (37, 100), (3, 7)])
def test_skip_rms_norm_matches_the_reference(math, rows, width, skip, offsets):
    rng = np.random.default_rng(rows * width)
    names = ["x", "skip" if skip else "", "gamma"] + (["oi", "ow"] if offsets else [])
    inputs = [_value("x", TensorProto.FLOAT, [rows, width]), _value("gamma", TensorProto.FLOAT, [width])]
    feeds = {"x": rng.standard_normal((rows, width)).astype(np.float32),
             "gamma": rng.standard_normal(width).astype(np.float32)}
    total = feeds["x"].astype(np.float64)
    if skip:
        inputs.append(_value("skip", TensorProto.FLOAT, [rows, width]))
        feeds["skip"] = rng.standard_normal((rows, width)).astype(np.float32)
        total = total + feeds["skip"]
    if offsets:
        inputs += [_value("oi", TensorProto.FLOAT, [rows, 96]), _value("ow", TensorProto.FLOAT16, [3, width])]
        feeds["oi"] = rng.standard_normal((rows, 96)).astype(np.float32)
        feeds["ow"] = rng.standard_normal((3, width)).astype(np.float16)
        total = total + _block_offsets(feeds["oi"], feeds["ow"])
    node = helper.make_node("SkipRMSNorm", names, ["y", "sum"], domain="oga", epsilon=1e-5)
    session = _session([node], inputs, [_value("y", TensorProto.FLOAT, [rows, width]),
                                        _value("sum", TensorProto.FLOAT, [rows, width])])
    y, got_total = session.run(None, feeds)
    expected = total / np.sqrt((total ** 2).mean(axis=1, keepdims=True) + 1e-5) * feeds["gamma"]
    assert np.abs(got_total - total).max() < 1e-4
    assert np.abs(y - expected).max() < 1e-4


@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize("rows, half", [(1, 1536), (20, 13)])
def test_swiglu_matches_the_reference(math, rows, half, offsets):
    rng = np.random.default_rng(rows + half)
    feeds = {"gu": (rng.standard_normal((rows, 2 * half)) * 4).astype(np.float32)}
    inputs = [_value("gu", TensorProto.FLOAT, [rows, 2 * half])]
    gate_up = feeds["gu"].astype(np.float64)
    if offsets:
        inputs += [_value("oi", TensorProto.FLOAT, [rows, 64]), _value("ow", TensorProto.FLOAT16, [2, 2 * half])]
        feeds["oi"] = rng.standard_normal((rows, 64)).astype(np.float32)
        feeds["ow"] = rng.standard_normal((2, 2 * half)).astype(np.float16)
        gate_up = gate_up + _block_offsets(feeds["oi"], feeds["ow"])
    node = helper.make_node("SwiGlu", ["gu"] + (["oi", "ow"] if offsets else []), ["y"], domain="oga")
    session = _session([node], inputs, [_value("y", TensorProto.FLOAT, [rows, half])])
    gate, up = gate_up[:, :half], gate_up[:, half:]
    expected = gate / (1 + np.exp(-gate)) * up
    assert np.abs(session.run(None, feeds)[0] - expected).max() < 1e-4 * max(1.0, np.abs(expected).max())


def test_norm_and_activation_errors():
    node = helper.make_node("SkipRMSNorm", ["x", "", "gamma", "oi", "ow"], ["y", "sum"], name="norm", domain="oga")
    session = _session([node], [_value("x", TensorProto.FLOAT, [2, 8]), _value("gamma", TensorProto.FLOAT, ["W"]),
                                _value("oi", TensorProto.FLOAT, [2, "K"]), _value("ow", TensorProto.FLOAT16, ["B", 8])],
                       [_value("y", TensorProto.FLOAT, [2, 8]), _value("sum", TensorProto.FLOAT, [2, 8])])
    feeds = {"x": np.zeros((2, 8), np.float32), "gamma": np.ones(8, np.float32),
             "oi": np.zeros((2, 64), np.float32), "ow": np.zeros((2, 8), np.float16)}
    session.run(None, feeds)
    with pytest.raises(Exception, match=r"oga\.SkipRMSNorm node 'norm': gamma \[7\] must have the input's 8 columns"):
        session.run(None, {**feeds, "gamma": np.ones(7, np.float32)})
    with pytest.raises(Exception, match=r"offset_weights \[3, 8\] must be \[2, 8\] for offset_input \[2, 64\]"):
        session.run(None, {**feeds, "ow": np.zeros((3, 8), np.float16)})
    node = helper.make_node("SwiGlu", ["gu"], ["y"], name="act", domain="oga")
    session = _session([node], [_value("gu", TensorProto.FLOAT, [2, "W"])], [_value("y", TensorProto.FLOAT, [2, "H"])])
    with pytest.raises(Exception, match=r"oga\.SwiGlu node 'act': gate_up \[2, 7\] must have an even number"):
        session.run(None, {"gu": np.zeros((2, 7), np.float32)})


# ------------------------------------------------------------------------------------------------
# LogitsHead

def _logits_head_session(vocab, hidden, weight, maxima=True, name="head"):
    outputs = ["logits", "maxima"] if maxima else ["logits"]
    node = helper.make_node("LogitsHead", ["x", "weight"], outputs, name=name, domain="oga")
    declared = [_value("logits", TensorProto.FLOAT, ["R", vocab])]
    if maxima:
        declared.append(_value("maxima", TensorProto.FLOAT, ["R", -(-vocab // 1024)]))
    return _session([node], [_value("x", TensorProto.FLOAT, ["R", "H"])], declared,
                    [helper.make_tensor("weight", TensorProto.FLOAT, weight.shape, weight.ravel())])


def _block_maxima(logits):
    rows, vocab = logits.shape
    padded = np.full((rows, -(-vocab // 1024) * 1024), -np.inf, np.float32)
    padded[:, :vocab] = np.where(np.isnan(logits), -np.inf, logits)
    return padded.reshape(rows, -1, 1024).max(axis=2)


# rows (tiles of 6, and the 1-3 row groups), vocab (a partial panel of 16, a partial block of 1024),
# hidden (odd, SmolLM2's 576)
@pytest.mark.parametrize("rows, vocab, hidden", [(1, 97, 64), (2, 2050, 40), (3, 4099, 33), (5, 1024, 8),
                                                 (16, 3000, 576), (13, 49, 17)])
def test_logits_head_matches_the_reference(math, rows, vocab, hidden):
    rng = np.random.default_rng(rows * vocab + hidden)
    weight = rng.standard_normal((vocab, hidden)).astype(np.float32)
    x = rng.standard_normal((rows, hidden)).astype(np.float32)
    logits, maxima = _logits_head_session(vocab, hidden, weight).run(None, {"x": x})
    expected = x.astype(np.float64) @ weight.T.astype(np.float64)
    assert logits.shape == (rows, vocab) and maxima.shape == (rows, -(-vocab // 1024))
    # float32 rounding of `hidden` products: a few ulps of the largest product per term
    assert np.abs(logits - expected).max() < 1e-6 * hidden * np.abs(x).max() * np.abs(weight).max()
    np.testing.assert_array_equal(maxima, _block_maxima(logits))


def test_logits_head_rows_do_not_depend_on_the_batch(math):
    """Each logit is one fixed-order sum: a row gives the same bits alone, in a tile of 6, in a
    partial tile and in the 1-3 row groups (the engine's streams must not change with the batch)."""
    rng = np.random.default_rng(21)
    weight = rng.standard_normal((2100, 576)).astype(np.float32)
    x = rng.standard_normal((16, 576)).astype(np.float32)
    session = _logits_head_session(2100, 576, weight)
    together, maxima = session.run(None, {"x": x})
    for count in (1, 2, 3, 7):
        part, part_maxima = session.run(None, {"x": x[:count]})
        np.testing.assert_array_equal(part, together[:count])
        np.testing.assert_array_equal(part_maxima, maxima[:count])
    for r in (0, 6, 15):
        np.testing.assert_array_equal(session.run(None, {"x": x[r:r + 1]})[0], together[r:r + 1])


def test_logits_head_block_maxima_ignore_nan_and_keep_infinities(math):
    rng = np.random.default_rng(22)
    weight = rng.standard_normal((1500, 16)).astype(np.float32)
    weight[1200] = 0.0
    weight[1200, 0] = 1.0
    x = rng.standard_normal((3, 16)).astype(np.float32)
    x[0, 3] = np.nan   # every logit of row 0 is NaN: no block maximum above -inf
    x[1, 0] = np.inf   # row 1's logit 1200 is +inf (and others +-inf or NaN)
    logits, maxima = _logits_head_session(1500, 16, weight).run(None, {"x": x})
    assert np.isnan(logits[0]).all()
    assert (maxima[0] == -np.inf).all()
    assert maxima[1, 1] == np.inf and logits[1, 1200] == np.inf
    np.testing.assert_array_equal(maxima, _block_maxima(logits))


def test_logits_head_without_the_maxima_output(math):
    rng = np.random.default_rng(23)
    weight = rng.standard_normal((300, 24)).astype(np.float32)
    x = rng.standard_normal((4, 24)).astype(np.float32)
    (logits,) = _logits_head_session(300, 24, weight, maxima=False).run(None, {"x": x})
    with_maxima, _ = _logits_head_session(300, 24, weight).run(None, {"x": x})
    np.testing.assert_array_equal(logits, with_maxima)


def test_logits_head_errors():
    weight = np.zeros((40, 8), np.float32)
    session = _logits_head_session(40, 8, weight, name="lm")
    with pytest.raises(Exception, match=r"oga\.LogitsHead node 'lm': x \[2, 7\] must have 8 columns"):
        session.run(None, {"x": np.zeros((2, 7), np.float32)})
    assert session.run(None, {"x": np.zeros((0, 8), np.float32)})[0].shape == (0, 40)
    # a weight fed at run time cannot be packed when the session is created
    node = helper.make_node("LogitsHead", ["x", "weight"], ["logits"], name="lm", domain="oga")
    with pytest.raises(Exception, match=r"oga\.LogitsHead node 'lm': weight must be a constant initializer"):
        _session([node], [_value("x", TensorProto.FLOAT, ["R", 8]), _value("weight", TensorProto.FLOAT, [40, 8])],
                 [_value("logits", TensorProto.FLOAT, ["R", 40])])


# ------------------------------------------------------------------------------------------------
# PackedCausalConv

def _causal_conv_with_state_session(activation):
    """ONNX Runtime's own com.microsoft.CausalConvWithState (one sequence per batch row)."""
    inputs = [_value("x", TensorProto.FLOAT, [1, "C", "L"]), _value("w", TensorProto.FLOAT, ["C", 1, "K"]),
              _value("b", TensorProto.FLOAT, ["C"]), _value("state", TensorProto.FLOAT, [1, "C", "S"])]
    node = helper.make_node("CausalConvWithState", ["x", "w", "b", "state"], ["y", "present"], domain="com.microsoft",
                            ndim=1, activation=activation)
    outputs = [_value("y", TensorProto.FLOAT, [1, "C", "L"]), _value("present", TensorProto.FLOAT, [1, "C", "S"])]
    graph = helper.make_graph([node], "conv", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _packed_conv_session(silu, bias=True):
    inputs = [_value("x", TensorProto.FLOAT, [1, "C", "N"]), _value("w", TensorProto.FLOAT, ["C", 1, "K"])]
    inputs += [_value("b", TensorProto.FLOAT, ["C"])] if bias else []
    inputs += [_value("state", TensorProto.FLOAT, ["B", "C", "S"]), _value("cu", TensorProto.INT32, ["B1"])]
    node = helper.make_node("PackedCausalConv", ["x", "w", "b" if bias else "", "state", "cu"], ["y", "present"],
                            domain="oga", name="conv", silu=int(silu))
    outputs = [_value("y", TensorProto.FLOAT, [1, "C", "N"]), _value("present", TensorProto.FLOAT, ["B", "C", "S"])]
    return _session([node], inputs, outputs)


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("lengths, taps", [([5, 1, 0, 12, 1], 3), ([1], 4), ([7, 2], 1), ([40, 3, 1], 5)])
def test_packed_causal_conv_matches_onnx_runtime_per_row(silu, lengths, taps):
    """Each packed row, convolved from its own state, gives what ONNX Runtime's CausalConvWithState
    gives for that row alone, outputs and new state; a row without tokens keeps its state; the state
    updates in place when present is bound to past."""
    rng = np.random.default_rng(sum(lengths) * taps + silu)
    channels = 24
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    x = rng.standard_normal((1, channels, int(cu[-1]))).astype(np.float32)
    w = rng.standard_normal((channels, 1, taps)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    state = rng.standard_normal((len(lengths), channels, taps - 1)).astype(np.float32)
    reference = _causal_conv_with_state_session("silu" if silu else "none")
    packed = _packed_conv_session(silu)
    in_place = state.copy()
    binding = packed.io_binding()
    for name, array in (("x", x), ("w", w), ("b", b), ("state", in_place), ("cu", cu)):
        binding.bind_cpu_input(name, array)
    y = np.zeros_like(x)
    binding.bind_output("y", "cpu", 0, np.float32, list(y.shape), y.ctypes.data)
    binding.bind_output("present", "cpu", 0, np.float32, list(in_place.shape), in_place.ctypes.data)
    packed.run_with_iobinding(binding)
    copied_y, copied_present = packed.run(None, {"x": x, "w": w, "b": b, "state": state, "cu": cu})
    for r, (begin, end) in enumerate(zip(cu[:-1], cu[1:])):
        if end == begin:
            assert np.array_equal(in_place[r], state[r]) and np.array_equal(copied_present[r], state[r])
            continue
        want_y, want_state = reference.run(None, {"x": x[:, :, begin:end], "w": w, "b": b, "state": state[r:r + 1]})
        assert np.abs(y[:, :, begin:end] - want_y).max() < 1e-5
        assert np.abs(copied_y[:, :, begin:end] - want_y).max() < 1e-5
        assert np.array_equal(in_place[r], want_state[0]) and np.array_equal(copied_present[r], want_state[0])


def test_packed_causal_conv_errors():
    session = _packed_conv_session(False, bias=False)
    x, w = np.zeros((1, 4, 3), np.float32), np.zeros((4, 1, 3), np.float32)
    state, cu = np.zeros((2, 4, 2), np.float32), np.array([0, 1, 3], np.int32)
    session.run(None, {"x": x, "w": w, "state": state, "cu": cu})
    with pytest.raises(Exception, match=r"PackedCausalConv.*past_state \[2, 4, 3\] must be \[batch_size, 4, 2\]"):
        session.run(None, {"x": x, "w": w, "state": np.zeros((2, 4, 3), np.float32), "cu": cu})
    with pytest.raises(Exception, match=r"cumulative_sequence_lengths must end at num_tokens \(3\), got 2"):
        session.run(None, {"x": x, "w": w, "state": state, "cu": np.array([0, 1, 2], np.int32)})
    with pytest.raises(Exception, match=r"cumulative_sequence_lengths \[2\] must have batch_size \+ 1 \(3\) entries"):
        session.run(None, {"x": x, "w": w, "state": state, "cu": np.array([0, 3], np.int32)})
    with pytest.raises(Exception, match=r"weight \[4, 1, 3\] must be \[5, 1, kernel_size\]"):
        session.run(None, {"x": np.zeros((1, 5, 3), np.float32), "w": w, "state": np.zeros((2, 5, 2), np.float32),
                           "cu": cu})
