"""Granite (3.x): a Llama with multipliers on the embeddings, the residual branches, the attention
scores (in place of 1/sqrt(head_dim)) and the logits (divided by logits_scaling). llama.cpp's
converter writes it as a Llama (q/k permuted) plus the four multipliers."""


def features(config: dict) -> dict:
    return {"embedding_multiplier": float(config.get("embedding_multiplier", 1.0)),
            "residual_multiplier": float(config.get("residual_multiplier", 1.0)),
            "attention_scale": float(config.get("attention_multiplier", 1.0)),
            "logits_multiplier": 1.0 / float(config.get("logits_scaling", 1.0)),
            "qkv_bias": bool(config.get("attention_bias", False))}


def gguf_features(metadata) -> dict:
    """embedding_scale, residual_scale, attention.scale and logit_scale (the logits are divided by
    it). The converter leaves out a multiplier that is 0 or missing, and llama.cpp then applies
    none (attention: 1 / sqrt(head_dim)), which these defaults reproduce."""
    logit_scale = metadata.get("logit_scale")
    return {"embedding_multiplier": float(metadata.get("embedding_scale") or 1.0),
            "residual_multiplier": float(metadata.get("residual_scale") or 1.0),
            "attention_scale": float(metadata.get("attention.scale") or 0.0) or None,
            "logits_multiplier": 1.0 / float(logit_scale) if logit_scale else 1.0}


ARCHITECTURE = dict(name="granite", hf_architectures=("GraniteForCausalLM",), hf_model_types=("granite",),
                    features=features, gguf_architecture="granite", gguf_permuted_qk=True,
                    gguf_features=gguf_features)
