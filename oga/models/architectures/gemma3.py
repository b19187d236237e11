"""Gemma 3 (text): Gemma 2's layout without its softcaps, plus q/k norms (with Gemma's 1 + weight)
and a RoPE base of its own for the windowed layers (rope_local_base_freq; the others use rope_theta
and any rope scaling).

GGUF: as Gemma 2 (every norm, the q/k norms included, stored as 1 + w; NeoX RoPE), q/k norms as
attn_q_norm / attn_k_norm, rope.freq_base the global layers' base. llama.cpp hard-codes the rest:
with a window (attention.sliding_window > 0) every layer but each 6th is windowed and those use a
RoPE base of 10000, unscaled; the query scale is hidden / heads for the 27B model (62 layers),
head_dim otherwise; there is no attention softcap, and a final softcap only where the file has one."""

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


GGUF_TENSOR_NAMES = dict(gemma2.GGUF_TENSOR_NAMES, **{"attn_q_norm.weight": "self_attn.q_norm.weight",
                                                      "attn_k_norm.weight": "self_attn.k_norm.weight"})


def gguf_features(metadata) -> dict:
    fields = metadata.fields
    window = int(metadata.get("attention.sliding_window", 0))
    return {"norm_offset": 1.0, "activation": "gelu_tanh", "output_norms": True, "qk_norm": True,
            "embedding_multiplier": math.sqrt(fields["hidden_size"]),
            "attention_scale": gemma2.llama_cpp_query_scale(fields, 62),
            "final_softcap": float(metadata.get("final_logit_softcapping", 0.0)),
            "sliding_window": window or None,
            "sliding_window_layers": gemma2.llama_cpp_windowed_layers(fields["num_layers"], 6) if window else None,
            "local_rope_theta": 10000.0 if window else None}


ARCHITECTURE = dict(name="gemma3", hf_architectures=("Gemma3ForCausalLM",), hf_model_types=("gemma3_text", "gemma3"),
                    features=features, hf_weight_renames=gemma2.RENAMES,
                    gguf_architecture="gemma3", gguf_permuted_qk=False, gguf_tensor_names=GGUF_TENSOR_NAMES,
                    gguf_features=gguf_features, gguf_norm_shift=1.0)
