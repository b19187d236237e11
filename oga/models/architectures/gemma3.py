"""Gemma 3 (text): Gemma 2's layout without its softcaps, plus q/k norms (with Gemma's 1 + weight)
and a RoPE base of its own for the windowed layers (rope_local_base_freq; the others use rope_theta
and any rope scaling)."""

import math

from . import gemma2
from .hf_config import windowed_layers


def _local_theta(config: dict) -> float:
    parameters = config.get("rope_parameters") or {}
    if isinstance(parameters.get("sliding_attention"), dict):      # transformers 5: per layer type
        return float(parameters["sliding_attention"].get("rope_theta", 10000.0))
    return float(parameters.get("rope_local_base_freq", config.get("rope_local_base_freq", 10000.0)))


def features(config: dict) -> dict:
    window, layers = windowed_layers(config)
    return {"norm_offset": 1.0, "activation": "gelu_tanh", "output_norms": True, "qk_norm": True,
            "embedding_multiplier": math.sqrt(int(config["hidden_size"])),
            "attention_scale": float(config.get("query_pre_attn_scalar") or int(config["head_dim"])) ** -0.5,
            "attention_softcap": float(config.get("attn_logit_softcapping") or 0.0),
            "final_softcap": float(config.get("final_logit_softcapping") or 0.0),
            "sliding_window": window, "sliding_window_layers": layers,
            "local_rope_theta": _local_theta(config) if window else None,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", True))}


ARCHITECTURE = dict(name="gemma3", hf_architectures=("Gemma3ForCausalLM",), hf_model_types=("gemma3_text", "gemma3"),
                    features=features, hf_weight_renames=gemma2.RENAMES)
