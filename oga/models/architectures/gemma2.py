"""Gemma 2: Gemma plus norms on the attention and MLP outputs (post_attention_layernorm,
post_feedforward_layernorm; the MLP's input norm is pre_feedforward_layernorm), softcaps on the
attention scores and the final logits, a scale of query_pre_attn_scalar^-1/2, and a sliding window on
the layers layer_types names (every other one).

GGUF: as Gemma (norms stored as 1 + w, no lm_head, NeoX RoPE), with the output norms as
post_attention_norm / post_ffw_norm (ffn_norm is the MLP's input norm), the softcaps and the window
in the metadata. llama.cpp hard-codes the rest: which layers are windowed (every other one, from
layer 0) and the query scale (hidden / heads for the 27B model, recognised by its 46 layers;
head_dim otherwise, which is query_pre_attn_scalar for the 2B and 9B)."""

import math

from .hf_config import windowed_layers

# Gemma 2's names -> oga's canonical ones (post_attention_layernorm is oga's pre-MLP norm).
RENAMES = {"post_attention_layernorm.weight": "attention_output_norm.weight",
           "pre_feedforward_layernorm.weight": "post_attention_layernorm.weight",
           "post_feedforward_layernorm.weight": "mlp_output_norm.weight"}

# llama.cpp's names of the output norms (its ffn_norm, the MLP's input norm, is the common name).
GGUF_TENSOR_NAMES = {"post_attention_norm.weight": "attention_output_norm.weight",
                     "post_ffw_norm.weight": "mlp_output_norm.weight"}


def features(config: dict) -> dict:
    window, layers = windowed_layers(config)
    return {"norm_offset": 1.0, "activation": "gelu_tanh", "output_norms": True,
            "embedding_multiplier": math.sqrt(int(config["hidden_size"])),
            "attention_scale": float(config.get("query_pre_attn_scalar") or int(config["head_dim"])) ** -0.5,
            "attention_softcap": float(config.get("attn_logit_softcapping") or 0.0),
            "final_softcap": float(config.get("final_logit_softcapping") or 0.0),
            "sliding_window": window, "sliding_window_layers": layers,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", True))}


def llama_cpp_windowed_layers(num_layers: int, period: int) -> list[int] | None:
    """llama.cpp's window pattern of period n: every layer but each n-th (layers n-1, 2n-1, ...) is
    windowed. None when that is every layer (a decoder shallower than the period)."""
    layers = [i for i in range(num_layers) if i % period < period - 1]
    return None if len(layers) == num_layers else layers


def llama_cpp_query_scale(fields: dict, layers_of_27b: int) -> float:
    """llama.cpp's query scale for Gemma 2 / 3: hidden / heads for the 27B model (recognised by
    its layer count), head_dim otherwise."""
    if fields["num_layers"] == layers_of_27b:
        return float(fields["hidden_size"] // fields["num_heads"]) ** -0.5
    return float(fields["head_dim"]) ** -0.5


def gguf_features(metadata) -> dict:
    fields = metadata.fields
    # llama.cpp's defaults where the keys are missing: window 4096, softcaps 50 and 30
    window = int(metadata.get("attention.sliding_window", 4096))
    return {"norm_offset": 1.0, "activation": "gelu_tanh", "output_norms": True,
            "embedding_multiplier": math.sqrt(fields["hidden_size"]),
            "attention_scale": llama_cpp_query_scale(fields, 46),
            "attention_softcap": float(metadata.get("attn_logit_softcapping", 50.0)),
            "final_softcap": float(metadata.get("final_logit_softcapping", 30.0)),
            "sliding_window": window, "sliding_window_layers": llama_cpp_windowed_layers(fields["num_layers"], 2)}


ARCHITECTURE = dict(name="gemma2", hf_architectures=("Gemma2ForCausalLM",), hf_model_types=("gemma2",),
                    features=features, hf_weight_renames=RENAMES,
                    gguf_architecture="gemma2", gguf_permuted_qk=False, gguf_tensor_names=GGUF_TENSOR_NAMES,
                    gguf_features=gguf_features, gguf_norm_shift=1.0)
