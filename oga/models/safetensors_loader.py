"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into a `LoadedModel`.

Supported `architectures`: LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM. Weights are
read with `safetensors.numpy` and cast to float32 (bfloat16 tensors, which numpy lacks, are
widened by hand). HF names and layouts are used as they are; tokenizer.json and
tokenizer_config.json are passed through when present.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from .spec import DecoderSpec, LoadedModel

_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
}


def spec_from_config(config: dict) -> DecoderSpec:
    """DecoderSpec from an HF config.json dict."""
    archs = config.get("architectures") or []
    arch = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
    if arch is None:
        arch = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral"}.get(
            config.get("model_type"))
    if arch is None:
        raise NotImplementedError(
            f"config.json architectures {archs} (model_type {config.get('model_type')!r}) are "
            f"not supported; supported: {', '.join(_ARCHITECTURES)}")
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    eos = config.get("eos_token_id", 2)
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    pad = config.get("pad_token_id")
    sliding = config.get("sliding_window")
    if arch == "qwen2" and not config.get("use_sliding_window", False):
        sliding = None
    if arch == "llama":
        sliding = None
    rope_scaling = config.get("rope_scaling")
    if rope_scaling is not None:
        rope_scaling = dict(rope_scaling)
        kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
        rope_scaling["rope_type"] = kind
        if kind == "default":
            rope_scaling = None
    tie = config.get("tie_word_embeddings")
    return DecoderSpec(
        architecture=arch,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rope_theta=float(config.get("rope_theta", 10000.0)),
        rope_scaling=rope_scaling,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        context_length=int(config.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(tie) if tie is not None else arch != "llama",
        qkv_bias=arch == "qwen2" or bool(config.get("attention_bias", False)),
        sliding_window=int(sliding) if sliding else None,
        bos_token_id=int(config.get("bos_token_id", 1) or 0),
        eos_token_ids=eos_ids,
        pad_token_id=int(pad) if pad is not None else eos_ids[0],
    )


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as float32 (BF16 widened by hand)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            f.seek(base + start)
            raw = f.read(end - start)
            dt = info["dtype"]
            if dt == "BF16":
                a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            elif dt in ("F32", "F16", "F64"):
                a = np.frombuffer(raw, dtype={"F32": "<f4", "F16": "<f2", "F64": "<f8"}[dt])
            else:
                raise NotImplementedError(f"{path}: tensor {name} has dtype {dt}; "
                                          f"expected F32, F16, BF16 or F64")
            out[name] = np.ascontiguousarray(a.astype(np.float32).reshape(info["shape"]))
    return out


def load_safetensors(hf_dir: str | os.PathLike) -> LoadedModel:
    """Read an HF directory: config.json, every *.safetensors file, tokenizer files if any."""
    hf_dir = os.fspath(hf_dir)
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        spec = spec_from_config(json.load(f))
    files = sorted(p for p in os.listdir(hf_dir) if p.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{hf_dir}: no *.safetensors files")
    weights: dict[str, np.ndarray] = {}
    for name in files:
        weights.update(_read_safetensors(os.path.join(hf_dir, name)))
    # Checkpoints often carry non-parameter buffers; drop the known ones.
    for key in [k for k in weights if k.endswith("rotary_emb.inv_freq")]:
        del weights[key]
    if spec.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    elif "lm_head.weight" not in weights:
        # config says untied but the checkpoint has no head: it is tied in practice
        spec.tie_word_embeddings = True
    spec.validate(weights)
    tok_json = tok_cfg = None
    path = os.path.join(hf_dir, "tokenizer.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            tok_json = f.read()
    path = os.path.join(hf_dir, "tokenizer_config.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            tok_cfg = json.load(f)
        template = os.path.join(hf_dir, "chat_template.jinja")
        if "chat_template" not in tok_cfg and os.path.exists(template):
            with open(template, encoding="utf-8") as f:
                tok_cfg["chat_template"] = f.read()
    return LoadedModel(spec=spec, weights=weights, tokenizer_json=tok_json,
                       tokenizer_config=tok_cfg)
