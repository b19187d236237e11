"""Phi-3 / Phi-3.5 / Phi-4-mini: a Llama whose checkpoints fuse q|k|v (qkv_proj) and gate|up
(gate_up_proj), with partial rotary (partial_rotary_factor) and LongRoPE (rope_scaling type
"longrope" / "su": short and long per-frequency factors, the long ones past
original_max_position_embeddings, both tables scaled by sqrt(1 + ln(s) / ln(original)) where
s = max_position_embeddings / original_max_position_embeddings, unless the config gives them).

GGUF: llama.cpp's converter keeps the fused attn_qkv and ffn_up (gate|up) and NeoX RoPE's row order,
and stores LongRoPE's factors as the tensors rope_factors_long / rope_factors_short (see
gguf_features). A yarn-scaled Phi-3 is written the same way with another magnitude, which llama.cpp
applies just as it applies LongRoPE's; oga reads both as LongRoPE with the stored magnitude."""

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


def fused_rows(spec) -> dict:
    """q|k|v and gate|up, as HF checkpoints store them (qkv_proj, gate_up_proj) and llama.cpp's
    converter keeps them (attn_qkv, and ffn_up, whose first half is the gate)."""
    q, kv, inter = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    return {"self_attn.qkv_proj.weight": [("self_attn.q_proj.weight", 0, q),
                                          ("self_attn.k_proj.weight", q, q + kv),
                                          ("self_attn.v_proj.weight", q + kv, q + 2 * kv)],
            "mlp.gate_up_proj.weight": [("mlp.gate_proj.weight", 0, inter),
                                        ("mlp.up_proj.weight", inter, 2 * inter)]}


# llama.cpp's fused tensors -> the HF names fused_rows splits. A file may also carry separate
# attn_q / attn_k / attn_v (llama.cpp accepts both), which the common names cover.
GGUF_TENSOR_NAMES = {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}


def gguf_features(metadata) -> dict:
    """Partial rotary from rope.dimension_count; the window from attention.sliding_window (the
    converter writes 0 for none, as for Phi-4-mini; llama.cpp itself currently runs every Phi-3
    without its window, oga keeps the model's); LongRoPE from the rope_factors_long / _short tensors,
    rope.scaling.original_context_length and rope.scaling.attn_factor (the one magnitude llama.cpp
    applies to both tables; the converter computes it as this module's default does)."""
    head_dim = metadata.fields["head_dim"]
    dims = metadata.get("rope.dimension_count")
    window = metadata.get("attention.sliding_window")
    fields = {"rotary_dim": int(dims) if dims and int(dims) != head_dim else None,
              "sliding_window": int(window) if window else None}
    long = metadata.tensor_values("rope_factors_long.weight")
    short = metadata.tensor_values("rope_factors_short.weight")
    if long is None and short is None:
        return fields
    if long is None or short is None:
        raise ValueError("GGUF file has only one of rope_factors_long / rope_factors_short")
    scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long,
               "original_max_position_embeddings": int(metadata.require("rope.scaling.original_context_length"))}
    magnitude = metadata.get("rope.scaling.attn_factor")
    default = long_rope_magnitudes(scaling, metadata.fields["context_length"])[0]
    if magnitude is not None and not math.isclose(magnitude, default, rel_tol=1e-6):
        scaling["short_mscale"] = scaling["long_mscale"] = float(magnitude)
    fields["rope_scaling"] = scaling
    return fields


ARCHITECTURE = dict(name="phi3", hf_architectures=("Phi3ForCausalLM",), hf_model_types=("phi3",),
                    features=features, fused_rows=fused_rows,
                    gguf_architecture="phi3", gguf_permuted_qk=False, gguf_tensor_names=GGUF_TENSOR_NAMES,
                    gguf_features=gguf_features)
