"""Gemma: a Llama whose norms scale by (1 + weight), whose MLP gate uses GELU (tanh approximation)
and whose embeddings are multiplied by sqrt(hidden_size); the head is tied.

GGUF: llama.cpp's converter stores every norm weight as 1 + w (undone by the loader through
gguf_norm_shift), drops any lm_head (llama.cpp always runs Gemma with the embedding as its head), keeps
q/k rows unpermuted (NeoX RoPE) and writes no RoPE base (llama.cpp's default, 10000, applies).
llama.cpp hard-codes the embedding scale sqrt(hidden) rather than storing it."""

import math


def features(config: dict) -> dict:
    return {"norm_offset": 1.0, "activation": "gelu_tanh",
            "embedding_multiplier": math.sqrt(int(config["hidden_size"])),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", True))}


def gguf_features(metadata) -> dict:
    return {"norm_offset": 1.0, "activation": "gelu_tanh",
            "embedding_multiplier": math.sqrt(metadata.fields["hidden_size"])}


ARCHITECTURE = dict(name="gemma", hf_architectures=("GemmaForCausalLM",), hf_model_types=("gemma",),
                    features=features, gguf_architecture="gemma", gguf_permuted_qk=False,
                    gguf_features=gguf_features, gguf_norm_shift=1.0)
