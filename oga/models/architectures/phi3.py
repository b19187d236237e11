"""Phi-3 / Phi-3.5 / Phi-4-mini: a Llama whose checkpoints fuse q|k|v (qkv_proj) and gate|up
(gate_up_proj), with partial rotary (partial_rotary_factor) and LongRoPE (rope_scaling type
"longrope" / "su": short and long per-frequency factors, the long ones past
original_max_position_embeddings, both tables scaled by sqrt(1 + ln(s) / ln(original)) where
s = max_position_embeddings / original_max_position_embeddings, unless the config gives them)."""

import math


def features(config: dict) -> dict:
    from .hf_config import rope_parameters

    factor = float(config.get("partial_rotary_factor", rope_parameters(config).get("partial_rotary_factor", 1.0)))
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))
    window = config.get("sliding_window")
    return {"rotary_dim": int(head_dim * factor) if factor != 1.0 else None,
            "sliding_window": int(window) if window else None,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False))}


def long_rope_magnitudes(scaling: dict, context_length: int) -> tuple[float, float]:
    """(short, long) multipliers of LongRoPE's cos / sin tables."""
    original = int(scaling["original_max_position_embeddings"])
    ratio = context_length / original
    default = 1.0 if ratio <= 1.0 else math.sqrt(1 + math.log(ratio) / math.log(original))
    short = float(scaling.get("short_mscale") or 0) or default
    long = float(scaling.get("long_mscale") or 0) or default
    return short, long


def split_fused(weights: dict, spec) -> None:
    q, kv, inter = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        qkv = weights.pop(p + "self_attn.qkv_proj.weight", None)
        if qkv is not None:
            if qkv.shape[0] != q + 2 * kv:
                raise ValueError(f"{p}self_attn.qkv_proj.weight has {qkv.shape[0]} rows; expected {q + 2 * kv}")
            weights[p + "self_attn.q_proj.weight"] = qkv[:q].copy()
            weights[p + "self_attn.k_proj.weight"] = qkv[q:q + kv].copy()
            weights[p + "self_attn.v_proj.weight"] = qkv[q + kv:].copy()
        gate_up = weights.pop(p + "mlp.gate_up_proj.weight", None)
        if gate_up is not None:
            if gate_up.shape[0] != 2 * inter:
                raise ValueError(f"{p}mlp.gate_up_proj.weight has {gate_up.shape[0]} rows; expected {2 * inter}")
            weights[p + "mlp.gate_proj.weight"] = gate_up[:inter].copy()
            weights[p + "mlp.up_proj.weight"] = gate_up[inter:].copy()


ARCHITECTURE = dict(name="phi3", hf_architectures=("Phi3ForCausalLM",), hf_model_types=("phi3",),
                    features=features, split_fused=split_fused)
