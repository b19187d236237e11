"""The shape and RoPE fields every architecture reads the same way from a Hugging Face config.json
dict (transformers 4's `rope_theta` / `rope_scaling` and transformers 5's `rope_parameters` alike)."""

from __future__ import annotations


def rope_parameters(config: dict) -> dict:
    """The RoPE settings: `rope_parameters` (transformers 5) merged over `rope_theta` / `rope_scaling`."""
    merged = {}
    if config.get("rope_theta") is not None:
        merged["rope_theta"] = config["rope_theta"]
    if config.get("rope_scaling"):
        merged.update(config["rope_scaling"])
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict):
        if isinstance(parameters.get("full_attention"), dict):   # transformers 5 nests them per layer type
            parameters = parameters["full_attention"]
        merged.update({k: v for k, v in parameters.items() if not isinstance(v, dict)})
    return merged


def rope_scaling(parameters: dict, config: dict) -> dict | None:
    """HF rope_scaling with `rope_type` set (None for the default RoPE); LongRoPE also carries
    original_max_position_embeddings (top-level in Phi-3's config)."""
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind in ("default", None):
        return None
    scaling = {k: v for k, v in parameters.items() if k not in ("rope_theta", "type", "partial_rotary_factor",
                                                                "rope_local_base_freq")}
    scaling["rope_type"] = "longrope" if kind == "su" else kind
    if scaling["rope_type"] == "longrope" and "original_max_position_embeddings" not in scaling:
        scaling["original_max_position_embeddings"] = int(config["original_max_position_embeddings"])
    return scaling


def common_fields(config: dict) -> dict:
    """The DecoderSpec fields every architecture shares, from config.json."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    eos = config.get("eos_token_id", 2)
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    pad = config.get("pad_token_id")
    parameters = rope_parameters(config)
    tie = config.get("tie_word_embeddings")
    return dict(
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rope_theta=float(parameters.get("rope_theta", 10000.0)),
        rope_scaling=rope_scaling(parameters, config),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        context_length=int(config.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(tie) if tie is not None else True,
        qkv_bias=bool(config.get("attention_bias", False)),
        sliding_window=None,
        bos_token_id=int(config.get("bos_token_id", 1) or 0),
        eos_token_ids=eos_ids,
        pad_token_id=int(pad) if pad is not None else eos_ids[0],
    )


def windowed_layers(config: dict) -> tuple[int | None, list[int] | None]:
    """(sliding_window, the windowed layers) from `layer_types` ("sliding_attention" entries), or
    (None, None) when no layer is windowed; every layer windowed gives (window, None)."""
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if not window or not types:
        return None, None
    layers = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    if not layers:
        return None, None
    return int(window), (None if len(layers) == len(types) else layers)
