"""Load a Llama-family GGUF file (llama.cpp's format) into a `LoadedModel`.

Tensors are dequantized to float32 with the `gguf` package and renamed to Hugging Face names.
GGUF stores a 2-D weight with `ne = [in, out]`; the reader hands it back as a numpy array of
shape [out, in], which is already HF's layout for linear weights.

llama.cpp's converter permutes the rows of `attn_q`/`attn_k` of "llama"-architecture models so
its interleaved RoPE (rotating pairs (0,1), (2,3), ...) gives the same result as HF's
rotate_half RoPE (pairs (i, i + D/2)). `load_gguf` undoes that permutation, so the weights here
use HF's RoPE convention. Qwen2 files are written without the permutation (llama.cpp runs them
with NeoX RoPE), so they are left as they are.
"""

from __future__ import annotations

import os

import numpy as np

from .spec import DecoderSpec, LoadedModel

SUPPORTED_QUANT_TYPES = ("F32", "F16", "BF16", "F64", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# GGUF architectures we load, and the spec architecture each becomes.
_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral"}
# Architectures whose converter permuted q/k rows for llama.cpp's interleaved RoPE.
_PERMUTED_QK = {"llama", "mistral"}

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors llama.cpp keeps that carry nothing for us (rope_freqs is read into rope_scaling).
_IGNORED = {"rope_freqs.weight"}


def hf_name(gguf_name: str) -> str | None:
    """The HF weight name of a GGUF tensor name, or None when it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        if rest in _LAYER_NAMES:
            return f"model.layers.{int(layer)}.{_LAYER_NAMES[rest]}"
    return None


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (convert_hf_to_gguf.LlamaModel.permute).

    The converter maps HF rows (head, half, i) to GGUF rows (head, i, half): within each head
    the two rotate_half halves are interleaved. This regroups them. Works for weights
    [n_heads * D, in] and biases [n_heads * D].
    """
    rows = w.shape[0]
    d = rows // n_heads
    return (w.reshape(n_heads, d // 2, 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's permutation (HF -> GGUF); the inverse of `unpermute_qk`, used by tests."""
    rows = w.shape[0]
    d = rows // n_heads
    return (w.reshape(n_heads, 2, d // 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))


def dequantize_tensor(tensor) -> np.ndarray:
    """A `gguf.ReaderTensor` as a float32 array of shape [out, in] (or [n] for 1-D)."""
    import gguf

    qtype = tensor.tensor_type
    name = qtype.name
    shape = tuple(int(n) for n in reversed([int(x) for x in tensor.shape]))
    if name == "F32":
        out = np.asarray(tensor.data, dtype=np.float32)
    elif name in ("F16", "F64"):
        out = np.asarray(tensor.data).astype(np.float32)
    elif name in SUPPORTED_QUANT_TYPES:
        out = gguf.quants.dequantize(np.asarray(tensor.data), qtype).astype(np.float32, copy=False)
    else:
        raise NotImplementedError(
            f"GGUF tensor {tensor.name!r} has type {name}, which oga cannot dequantize; "
            f"supported types: {', '.join(SUPPORTED_QUANT_TYPES)}")
    return np.ascontiguousarray(out.reshape(shape))


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _f32(v) -> float:
    """A float32 metadata value as the decimal it was written from (9.99999975e-06 -> 1e-05)."""
    return float(str(np.float32(v)))


def _llama3_factors(factor, low, high, original, head_dim, theta):
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv
    low_wl, high_wl = original / low, original / high
    smooth = (original / wavelen - low) / (high - low)
    scaled = np.where(wavelen > low_wl, 1.0 / factor,
                      np.where(wavelen < high_wl, 1.0, (1 - smooth) / factor + smooth))
    return 1.0 / scaled          # llama.cpp's rope_freqs divide the frequencies


def _rope_scaling(reader, arch, head_dim, theta, rope_freqs):
    """HF rope_scaling from GGUF metadata / the rope_freqs tensor, or None."""
    kind = _field(reader, f"{arch}.rope.scaling.type")
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    if rope_freqs is not None:
        # Llama 3.x: the converter stores the llama3 per-frequency factors as a tensor and not
        # their parameters; recover the parameters by matching the known recipes.
        rope_freqs = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
        f = _f32(rope_freqs.max())
        for original in (8192, 4096, 2048, 16384, 32768, 131072):
            for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0)):
                cand = _llama3_factors(f, low, high, original, head_dim, theta)
                if cand.shape == rope_freqs.shape and np.allclose(cand, rope_freqs, rtol=1e-4):
                    return {"rope_type": "llama3", "factor": f, "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": original}
        raise NotImplementedError(
            "GGUF rope_freqs tensor does not match a known llama3 rope_scaling recipe; "
            "oga cannot represent arbitrary per-frequency RoPE factors")
    if kind in (None, "none") or factor in (None, 0.0, 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": _f32(factor)}
    raise NotImplementedError(f"GGUF rope scaling type {kind!r} is not supported (linear, llama3)")


def _token_ids(reader) -> tuple[int, list[int], int]:
    bos = _field(reader, "tokenizer.ggml.bos_token_id", 1)
    eos = _field(reader, "tokenizer.ggml.eos_token_id", 2)
    eos_ids = [int(eos)]
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        extra = _field(reader, key)
        if extra is not None and int(extra) not in eos_ids:
            eos_ids.append(int(extra))
    pad = _field(reader, "tokenizer.ggml.padding_token_id", eos)
    return int(bos), eos_ids, int(pad)


def read_spec(reader) -> DecoderSpec:
    """The DecoderSpec of an open `gguf.GGUFReader` (metadata only, plus tensor presence)."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported; "
                                  f"supported: {', '.join(_ARCHITECTURES)}")
    names = {t.name: t for t in reader.tensors}

    def need(key):
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise ValueError(f"GGUF metadata lacks {arch}.{key}")
        return v

    hidden = int(need("embedding_length"))
    n_heads = int(need("attention.head_count"))
    n_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // n_heads))
    theta = _f32(_field(reader, f"{arch}.rope.freq_base", 10000.0))
    emb = names["token_embd.weight"]
    vocab = int(_field(reader, f"{arch}.vocab_size", int(emb.shape[1])))
    sliding = _field(reader, f"{arch}.attention.sliding_window")
    sliding = int(sliding) if sliding else None
    rope_freqs = names.get("rope_freqs.weight")
    bos, eos_ids, pad = _token_ids(reader)
    spec_arch = _ARCHITECTURES[arch]
    if spec_arch == "llama" and sliding is not None:
        spec_arch = "mistral"
    return DecoderSpec(
        architecture=spec_arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=_rope_scaling(reader, arch, head_dim, theta,
                                   None if rope_freqs is None else dequantize_tensor(rope_freqs)),
        rms_norm_eps=_f32(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        context_length=int(_field(reader, f"{arch}.context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        sliding_window=sliding,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        pad_token_id=pad,
    )


def exact_blocks(tensor, rows: np.ndarray | None = None):
    """The MatMulNBits form of a 2-D Q4_0 / Q4_1 / Q8_0 tensor, its blocks repacked exactly (rows
    reordered by `rows` when given), or None for any other type."""
    from . import quantize

    name = tensor.tensor_type.name
    if name not in quantize.GGUF_EXACT_TYPES or len(tensor.shape) != 2:
        return None
    k, n = (int(x) for x in tensor.shape)                # GGUF ne = [in, out]
    blocks = quantize.from_gguf(name, np.asarray(tensor.data), n, k)
    return blocks if rows is None else blocks.take_rows(rows)


def load_gguf(path: str | os.PathLike, *, with_tokenizer: bool = True) -> LoadedModel:
    """Read a GGUF file: spec from metadata, float32 HF-named weights, the exactly repackable
    quantized tensors as MatMulNBits blocks (LoadedModel.blocks), tokenizer files."""
    import gguf

    reader = gguf.GGUFReader(os.fspath(path))
    arch = _field(reader, "general.architecture")
    spec = read_spec(reader)
    weights: dict[str, np.ndarray] = {}
    blocks = {}
    for tensor in reader.tensors:
        if tensor.name in _IGNORED:
            continue
        name = hf_name(tensor.name)
        if name is None:
            raise NotImplementedError(f"GGUF tensor {tensor.name!r} ({arch}) has no "
                                      f"counterpart in oga's Llama-family decoder")
        w = dequantize_tensor(tensor)
        rows = None
        if arch in _PERMUTED_QK:
            heads = spec.num_heads if ".q_proj." in name else spec.num_kv_heads if ".k_proj." in name else None
            if heads is not None:
                rows = unpermute_qk(np.arange(w.shape[0]), heads)
                w = w[rows]
        weights[name] = w
        quantized = exact_blocks(tensor, rows)
        if quantized is not None:
            blocks[name] = quantized
    if spec.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
        blocks.pop("lm_head.weight", None)
    spec.validate(weights)
    tok_json = tok_cfg = None
    if with_tokenizer and _field(reader, "tokenizer.ggml.model") is not None:
        from .tokenizer_export import tokenizer_from_gguf
        tok_json, tok_cfg = tokenizer_from_gguf(reader)
    return LoadedModel(spec=spec, weights=weights, tokenizer_json=tok_json,
                       tokenizer_config=tok_cfg, blocks=blocks)
