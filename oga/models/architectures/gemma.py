"""Gemma: a Llama whose norms scale by (1 + weight), whose MLP gate uses GELU (tanh approximation)
and whose embeddings are multiplied by sqrt(hidden_size); the head is tied."""

import math


def features(config: dict) -> dict:
    return {"norm_offset": 1.0, "activation": "gelu_tanh",
            "embedding_multiplier": math.sqrt(int(config["hidden_size"])),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", True))}


ARCHITECTURE = dict(name="gemma", hf_architectures=("GemmaForCausalLM",), hf_model_types=("gemma",),
                    features=features)
