"""The architecture registry: one module per decoder architecture, each declaring how a checkpoint of
it maps onto oga's DecoderSpec (its features) and canonical weight names. The loaders (safetensors,
GGUF) find the architecture here; the graph builders and the numpy reference read only the
DecoderSpec's features, so adding an architecture is one module here plus its tests.

An architecture module defines ARCHITECTURE, an `Architecture`:
- `features(config)`: the DecoderSpec fields beyond the shape ones (hf_config.common_fields reads
  those), from the Hugging Face config.json dict;
- `hf_weight_renames`: per-layer weight names that differ from oga's canonical (Llama) ones;
- `split_fused(weights, spec)`: tensors the checkpoint fuses (Phi-3's qkv_proj, gate_up_proj) split
  into the canonical parts;
- `gguf_architecture` / `gguf_permuted_qk`: llama.cpp's name for it, and whether llama.cpp's
  converter permuted the q/k rows for its interleaved RoPE (None: GGUF files are not read yet).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from . import gemma, gemma2, gemma3, granite, llama, mistral, phi3, qwen2, qwen3


@dataclasses.dataclass(frozen=True)
class Architecture:
    name: str                                   # DecoderSpec.architecture, genai_config's model.type
    hf_architectures: tuple[str, ...]           # config.json `architectures` entries
    hf_model_types: tuple[str, ...]             # config.json `model_type` values
    features: Callable[[dict], dict]            # HF config -> DecoderSpec feature fields
    hf_weight_renames: dict = dataclasses.field(default_factory=dict)   # layer suffix -> canonical suffix
    split_fused: Callable | None = None         # (weights, spec) -> None, splitting fused tensors in place
    gguf_architecture: str | None = None        # general.architecture of llama.cpp's GGUF files
    gguf_permuted_qk: bool = False              # llama.cpp permuted attn_q / attn_k rows


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


def for_gguf(name: str) -> Architecture:
    """The architecture of a GGUF file's general.architecture."""
    for architecture in REGISTRY.values():
        if architecture.gguf_architecture == name:
            return architecture
    known = sorted(a.gguf_architecture for a in REGISTRY.values() if a.gguf_architecture)
    raise NotImplementedError(f"GGUF architecture {name!r} is not supported; supported: {', '.join(known)}")
