"""Load a GGUF file (llama.cpp's format) into a `LoadedModel`, for any architecture of the registry
(oga.models.architectures) that declares its GGUF side.

The file's general.architecture picks the architecture (`architectures.for_gguf`). The shape fields
every architecture stores alike (`common_fields`) are read here; the module's `gguf_features` reads
the rest of the DecoderSpec from the metadata. Tensors are dequantized to float32 with the `gguf`
package and renamed to oga's canonical (Hugging Face) names: the common Llama names below plus the
module's `gguf_tensor_names`. A 2-D GGUF tensor has `ne = [in, out]`; the reader hands it back as a
numpy array [out, in], already HF's layout for linear weights. Then the converter's own changes are
undone, as the module declares them:

- q/k row permutation (`gguf_permuted_qk`): llama.cpp's converter permutes the rows of `attn_q` /
  `attn_k` of Llama-like models so its interleaved RoPE (rotating pairs (0,1), (2,3), ...) gives HF's
  rotate_half RoPE (pairs (i, i + D/2)); the loader restores HF's order. NeoX-RoPE architectures
  (Qwen, Phi-3, Gemma) are stored unpermuted.
- fused tensors (`fused_rows`): Phi-3's attn_qkv and gate|up ffn_up are split into their parts.
- norm shift (`gguf_norm_shift`): Gemma's converter stores every RMSNorm weight as 1 + w.
- tensors that hold settings rather than weights (llama3's rope_freqs, LongRoPE's rope factors) are
  read into the spec by whoever asks for them (`GGUFMetadata.tensor`) and left out of the weights.

Q4_0 / Q4_1 / Q8_0 tensors also keep their blocks, repacked exactly for MatMulNBits
(LoadedModel.blocks), through the same renames, permutations and splits.
"""

from __future__ import annotations

import os

import numpy as np

from . import architectures
from .spec import DecoderSpec, LoadedModel

SUPPORTED_QUANT_TYPES = ("F32", "F16", "BF16", "F64", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

# llama.cpp's per-layer tensor names common to the Llama-like architectures -> oga's canonical names
# (an architecture's gguf_tensor_names add to them or override them).
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


def canonical_name(gguf_name: str, architecture: architectures.Architecture) -> str | None:
    """oga's name of a GGUF tensor of `architecture` (a fused name for a tensor `fused_rows` splits),
    or None when it has no counterpart."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        name = architecture.gguf_tensor_names.get(rest, _LAYER_NAMES.get(rest))
        if name is not None:
            return f"model.layers.{int(layer)}.{name}"
    return None


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo the q/k row permutation llama.cpp's converter applies to Llama-like models.

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
    """A float32 value as the decimal it was written from (9.99999975e-06 -> 1e-05)."""
    return float(str(np.float32(v)))


class GGUFMetadata:
    """A GGUF file's settings as an architecture module reads them (its `gguf_features`):

    - `get(key, default)` / `require(key)`: the value of `{general.architecture}.{key}`, float32
      values as the decimals they were written from (the converter wrote Python floats);
    - `has_tensor(name)`; `tensor(name)` / `tensor_values(name)`: a tensor that holds settings
      rather than weights (llama3's rope_freqs, LongRoPE's rope_factors_*), dequantized; the loader
      leaves every tensor read this way out of the weights;
    - `fields`: the common DecoderSpec fields read so far (`common_fields`), for the shapes.
    """

    def __init__(self, reader):
        import gguf

        self._reader = reader
        self._float32 = gguf.GGUFValueType.FLOAT32
        self.architecture = _field(reader, "general.architecture")
        self._tensors = {t.name: t for t in reader.tensors}
        self.settings_tensors: set[str] = set()
        self.fields: dict = {}

    def get(self, key: str, default=None):
        field = self._reader.fields.get(f"{self.architecture}.{key}")
        if field is None:
            return default
        value = field.contents()
        if field.types and field.types[0] == self._float32 and isinstance(value, float):
            return _f32(value)
        return value

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {self.architecture}.{key}")
        return value

    def general(self, key: str, default=None):
        """A key outside the architecture's section (tokenizer.ggml.*), as stored."""
        return _field(self._reader, key, default)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def tensor_rows(self, name: str) -> int:
        """The number of rows (out_features) of a 2-D tensor, without reading it."""
        if name not in self._tensors:
            raise ValueError(f"GGUF file ({self.architecture}) has no tensor {name!r}")
        return int(self._tensors[name].shape[1])

    def tensor(self, name: str) -> np.ndarray | None:
        if name not in self._tensors:
            return None
        self.settings_tensors.add(name)
        return dequantize_tensor(self._tensors[name])

    def tensor_values(self, name: str) -> list[float] | None:
        values = self.tensor(name)
        return None if values is None else [_f32(v) for v in values.reshape(-1)]


def _llama3_factors(factor, low, high, original, head_dim, theta):
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv
    low_wl, high_wl = original / low, original / high
    smooth = (original / wavelen - low) / (high - low)
    scaled = np.where(wavelen > low_wl, 1.0 / factor,
                      np.where(wavelen < high_wl, 1.0, (1 - smooth) / factor + smooth))
    return 1.0 / scaled          # llama.cpp's rope_freqs divide the frequencies


def _rope_scaling(metadata: GGUFMetadata, head_dim: int, theta: float) -> dict | None:
    """HF rope_scaling from the rope.scaling keys / the rope_freqs tensor, or None (an architecture's
    gguf_features may replace it: Phi-3's LongRoPE)."""
    kind = metadata.get("rope.scaling.type")
    factor = metadata.get("rope.scaling.factor")
    rope_freqs = metadata.tensor("rope_freqs.weight")
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
        return {"rope_type": "linear", "factor": factor}
    raise NotImplementedError(f"GGUF rope scaling type {kind!r} is not supported (linear, llama3)")


def _token_ids(metadata: GGUFMetadata) -> tuple[int, list[int], int]:
    bos = metadata.general("tokenizer.ggml.bos_token_id", 1)
    eos = metadata.general("tokenizer.ggml.eos_token_id", 2)
    eos_ids = [int(eos)]
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        extra = metadata.general(key)
        if extra is not None and int(extra) not in eos_ids:
            eos_ids.append(int(extra))
    pad = metadata.general("tokenizer.ggml.padding_token_id", eos)
    return int(bos), eos_ids, int(pad)


def common_fields(metadata: GGUFMetadata) -> dict:
    """The DecoderSpec fields every architecture stores the same way (the features are left at
    Llama's: the architecture's gguf_features sets its own)."""
    hidden = int(metadata.require("embedding_length"))
    heads = int(metadata.require("attention.head_count"))
    # key_length is written where head_dim is not hidden / heads (Gemma, Qwen3); llama.cpp
    # defaults to hidden / heads otherwise
    head_dim = int(metadata.get("attention.key_length", hidden // heads))
    theta = float(metadata.get("rope.freq_base", 10000.0))        # llama.cpp's default base
    bos, eos_ids, pad = _token_ids(metadata)
    return dict(
        vocab_size=int(metadata.get("vocab_size") or metadata.tensor_rows("token_embd.weight")),
        hidden_size=hidden,
        intermediate_size=int(metadata.require("feed_forward_length")),
        num_layers=int(metadata.require("block_count")),
        num_heads=heads,
        num_kv_heads=int(metadata.get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=_rope_scaling(metadata, head_dim, theta),
        rms_norm_eps=float(metadata.get("attention.layer_norm_rms_epsilon", 1e-6)),
        context_length=int(metadata.get("context_length", 4096)),
        # llama.cpp runs a file without an output tensor with the embedding as its LM head
        tie_word_embeddings=not metadata.has_tensor("output.weight"),
        qkv_bias=metadata.has_tensor("blk.0.attn_q.bias"),
        sliding_window=None,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        pad_token_id=pad,
    )


def read_spec(metadata: GGUFMetadata) -> tuple[DecoderSpec, architectures.Architecture]:
    """The DecoderSpec of a GGUF file (metadata and settings tensors only) and its architecture."""
    base = architectures.for_gguf(metadata.architecture)
    fields = common_fields(metadata)
    metadata.fields = fields
    if base.gguf_features is not None:
        fields.update(base.gguf_features(metadata))
    architecture = architectures.for_gguf(metadata.architecture, fields)
    return DecoderSpec(architecture=architecture.name, **fields), architecture


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


def _is_norm(name: str) -> bool:
    """Whether a canonical weight name is an RMSNorm weight."""
    return name.endswith(("layernorm.weight", "_norm.weight", "model.norm.weight"))


def load_gguf(path: str | os.PathLike, *, with_tokenizer: bool = True) -> LoadedModel:
    """Read a GGUF file: spec from metadata, float32 weights under oga's canonical names, the
    exactly repackable quantized tensors as MatMulNBits blocks (LoadedModel.blocks), tokenizer files."""
    import gguf

    reader = gguf.GGUFReader(os.fspath(path))
    metadata = GGUFMetadata(reader)
    spec, architecture = read_spec(metadata)
    weights: dict[str, np.ndarray] = {}
    blocks = {}
    for tensor in reader.tensors:
        if tensor.name in metadata.settings_tensors:
            continue
        name = canonical_name(tensor.name, architecture)
        if name is None:
            raise NotImplementedError(f"GGUF tensor {tensor.name!r} ({metadata.architecture}) has no "
                                      f"counterpart in oga's {architecture.name} decoder")
        w = dequantize_tensor(tensor)
        rows = None
        if architecture.gguf_permuted_qk:
            heads = spec.num_heads if ".q_proj." in name else spec.num_kv_heads if ".k_proj." in name else None
            if heads is not None:
                rows = unpermute_qk(np.arange(w.shape[0]), heads)
                w = w[rows]
        if architecture.gguf_norm_shift and _is_norm(name):
            # The file holds the converter's float32 sum s = shift + w. s - shift is exact in float32
            # wherever s >= shift / 2 (Sterbenz), so the graph's norm_offset + weight gives back s
            # itself: the scale llama.cpp computes with (w's bits below s's precision are gone).
            w = w - np.float32(architecture.gguf_norm_shift)
        weights[name] = w
        quantized = exact_blocks(tensor, rows)
        if quantized is not None:
            blocks[name] = quantized
    architectures.split_fused(architecture, weights, spec)
    architectures.split_fused(architecture, blocks, spec)
    if spec.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
        blocks.pop("lm_head.weight", None)
    spec.validate(weights)
    tok_json = tok_cfg = None
    if with_tokenizer and metadata.general("tokenizer.ggml.model") is not None:
        from .tokenizer_export import tokenizer_from_gguf
        tok_json, tok_cfg = tokenizer_from_gguf(reader)
    return LoadedModel(spec=spec, weights=weights, tokenizer_json=tok_json,
                       tokenizer_config=tok_cfg, blocks=blocks)
