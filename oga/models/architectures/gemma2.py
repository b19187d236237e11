"""Gemma 2: Gemma plus norms on the attention and MLP outputs (post_attention_layernorm,
post_feedforward_layernorm; the MLP's input norm is pre_feedforward_layernorm), softcaps on the
attention scores and the final logits, a scale of query_pre_attn_scalar^-1/2, and a sliding window on
the layers layer_types names (every other one)."""

import math

from .hf_config import windowed_layers

# Gemma 2's names -> oga's canonical ones (post_attention_layernorm is oga's pre-MLP norm).
RENAMES = {"post_attention_layernorm.weight": "attention_output_norm.weight",
           "pre_feedforward_layernorm.weight": "post_attention_layernorm.weight",
           "post_feedforward_layernorm.weight": "mlp_output_norm.weight"}


def features(config: dict) -> dict:
    window, layers = windowed_layers(config)
    return {"norm_offset": 1.0, "activation": "gelu_tanh", "output_norms": True,
            "embedding_multiplier": math.sqrt(int(config["hidden_size"])),
            "attention_scale": float(config.get("query_pre_attn_scalar") or int(config["head_dim"])) ** -0.5,
            "attention_softcap": float(config.get("attn_logit_softcapping") or 0.0),
            "final_softcap": float(config.get("final_logit_softcapping") or 0.0),
            "sliding_window": window, "sliding_window_layers": layers,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", True))}


ARCHITECTURE = dict(name="gemma2", hf_architectures=("Gemma2ForCausalLM",), hf_model_types=("gemma2",),
                    features=features, hf_weight_renames=RENAMES)
