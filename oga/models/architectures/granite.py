"""Granite (3.x): a Llama with multipliers on the embeddings, the residual branches, the attention
scores (in place of 1/sqrt(head_dim)) and the logits (divided by logits_scaling)."""


def features(config: dict) -> dict:
    return {"embedding_multiplier": float(config.get("embedding_multiplier", 1.0)),
            "residual_multiplier": float(config.get("residual_multiplier", 1.0)),
            "attention_scale": float(config.get("attention_multiplier", 1.0)),
            "logits_multiplier": 1.0 / float(config.get("logits_scaling", 1.0)),
            "qkv_bias": bool(config.get("attention_bias", False))}


ARCHITECTURE = dict(name="granite", hf_architectures=("GraniteForCausalLM",), hf_model_types=("granite",),
                    features=features)
