"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into a `LoadedModel`.

The architecture comes from the registry (oga.models.architectures: config.json's `architectures`,
else `model_type`), which also says how its config maps onto the DecoderSpec and which of its weight
names differ from oga's canonical ones. Weights are read with `safetensors.numpy` and cast to float32
(bfloat16 tensors, which numpy lacks, are widened by hand); tokenizer.json and tokenizer_config.json
are passed through when present.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from . import architectures
from .architectures.hf_config import common_fields
from .spec import DecoderSpec, LoadedModel


def spec_from_config(config: dict) -> DecoderSpec:
    """DecoderSpec from an HF config.json dict."""
    architecture = architectures.for_hf_config(config)
    fields = common_fields(config)
    fields.update(architecture.features(config))
    return DecoderSpec(architecture=architecture.name, **fields)


def canonical_weights(weights: dict, spec: DecoderSpec) -> None:
    """Renames (and splits) an HF checkpoint's weights into oga's canonical names, in place."""
    architecture = architectures.REGISTRY[spec.architecture]
    architectures.split_fused(architecture, weights, spec)
    for old, new in architecture.hf_weight_renames.items():
        moved = {}
        for name in [k for k in weights if k.startswith("model.layers.") and k.endswith("." + old)]:
            moved[name[:-len(old)] + new] = weights.pop(name)
        weights.update(moved)


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
    canonical_weights(weights, spec)
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
