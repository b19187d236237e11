"""The architecture registry: one module per decoder architecture, each declaring how a checkpoint of
it maps onto oga's DecoderSpec (its features) and canonical weight names. The loaders (safetensors,
GGUF) find the architecture here; the graph builders and the numpy reference read only the
DecoderSpec's features, so adding an architecture is one module here plus its tests.

An architecture module defines ARCHITECTURE, an `Architecture`:
- `features(config)`: the DecoderSpec fields beyond the shape ones (hf_config.common_fields reads
  those), from the Hugging Face config.json dict;
- `hf_weight_renames`: per-layer weight names that differ from oga's canonical (Llama) ones;
- `fused_rows(spec)`: tensors the checkpoint fuses (Phi-3's qkv_proj, gate_up_proj), each with the
  row ranges of its canonical parts; `split_fused` splits them, float arrays and GGUF blocks alike;
- its GGUF side, for llama.cpp's files (oga.models.gguf_loader):
  - `gguf_architecture`: llama.cpp's general.architecture for it (None: GGUF files are not read);
    `gguf_when(fields)`: for an architecture llama.cpp writes under another's name (Mistral as
    "llama"), whether the fields read from a file make it this one;
  - `gguf_permuted_qk`: llama.cpp's converter permuted the attn_q / attn_k rows for its interleaved
    RoPE (the loader undoes it);
  - `gguf_tensor_names`: its per-layer GGUF tensor names beyond the common Llama ones, to canonical
    names (or to the fused names `fused_rows` splits);
  - `gguf_features(metadata)`: the DecoderSpec feature fields from the file's metadata (a
    gguf_loader.GGUFMetadata: keys without the architecture prefix, and the tensors that hold
    settings, such as LongRoPE's rope factors); a setting llama.cpp hard-codes instead of storing
    (Gemma 3's window pattern, its local RoPE base) is read the way llama.cpp reads it, and the
    module says so;
  - `gguf_norm_shift`: what the converter added to every RMSNorm weight (Gemma's 1 + w: the
    loader subtracts it).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from . import gemma, gemma2, gemma3, granite, llama, mistral, phi3, qwen2, qwen3


@dataclasses.dataclass(frozen=True)
class Architecture:
    name: str                                   # DecoderSpec.architecture, genai_config's model.type
    hf_architectures: tuple[str, ...]           # config.json `architectures` entries
    hf_model_types: tuple[str, ...]             # config.json `model_type` values
    features: Callable[[dict], dict]            # HF config -> DecoderSpec feature fields
    hf_weight_renames: dict = dataclasses.field(default_factory=dict)   # layer suffix -> canonical suffix
    fused_rows: Callable | None = None          # spec -> {fused suffix: [(part suffix, start, stop)]}
    gguf_architecture: str | None = None        # general.architecture of llama.cpp's GGUF files
    gguf_when: Callable | None = None           # fields -> bool, for one of several sharing a GGUF name
    gguf_permuted_qk: bool = False              # llama.cpp permuted attn_q / attn_k rows
    gguf_tensor_names: dict = dataclasses.field(default_factory=dict)   # GGUF layer suffix -> canonical
    gguf_features: Callable | None = None       # GGUFMetadata -> DecoderSpec feature fields
    gguf_norm_shift: float = 0.0                # added to every RMSNorm weight by llama.cpp's converter


def _collect():
    registry = {}
    for module in (llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3, granite):
        fields = module.ARCHITECTURE
        architecture = Architecture(**fields)
        registry[architecture.name] = architecture
    return registry


REGISTRY: dict[str, Architecture] = _collect()


def for_hf_config(config: dict) -> Architecture:
    """The architecture of an HF config.json dict (by `architectures`, else `model_type`)."""
    for name in config.get("architectures") or []:
        for architecture in REGISTRY.values():
            if name in architecture.hf_architectures:
                return architecture
    for architecture in REGISTRY.values():
        if config.get("model_type") in architecture.hf_model_types:
            return architecture
    known = sorted(a for arch in REGISTRY.values() for a in arch.hf_architectures)
    raise NotImplementedError(
        f"config.json architectures {config.get('architectures') or []} (model_type {config.get('model_type')!r}) "
        f"are not supported; supported: {', '.join(known)}")


def for_gguf(name: str, fields: dict | None = None) -> Architecture:
    """The architecture of a GGUF file's general.architecture. Several may share a name (llama.cpp
    writes Mistral as "llama"): with the fields read from the file, the one whose `gguf_when` holds,
    else (and without fields) the one that declares no `gguf_when`."""
    candidates = [a for a in REGISTRY.values() if a.gguf_architecture == name]
    if not candidates:
        known = sorted({a.gguf_architecture for a in REGISTRY.values() if a.gguf_architecture})
        raise NotImplementedError(f"GGUF architecture {name!r} is not supported; supported: {', '.join(known)}")
    if fields is not None:
        for architecture in candidates:
            if architecture.gguf_when is not None and architecture.gguf_when(fields):
                return architecture
    return next(a for a in candidates if a.gguf_when is None)


def split_fused(architecture: Architecture, tensors: dict, spec) -> None:
    """Replaces, in place, each fused tensor the architecture declares (per layer) by its canonical
    parts: row ranges of a float array [rows, in] or of a quantize.BlockQuantized (whose blocks run
    along the input dimension, so a row range is exact)."""
    if architecture.fused_rows is None:
        return
    for fused, parts in architecture.fused_rows(spec).items():
        expected = parts[-1][2]
        for i in range(spec.num_layers):
            prefix = f"model.layers.{i}."
            tensor = tensors.pop(prefix + fused, None)
            if tensor is None:
                continue
            rows = tensor.shape[0] if isinstance(tensor, np.ndarray) else tensor.n
            if rows != expected:
                raise ValueError(f"{prefix}{fused} has {rows} rows; expected {expected}")
            for part, start, stop in parts:
                if isinstance(tensor, np.ndarray):
                    tensors[prefix + part] = tensor[start:stop].copy()
                else:
                    tensors[prefix + part] = tensor.take_rows(np.arange(start, stop))
