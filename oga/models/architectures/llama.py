"""Llama (and SmolLM, which is a Llama): the canonical layout every other architecture is described
against (RMSNorm, SiLU-gated MLP, RoPE on whole heads)."""


def features(config: dict) -> dict:
    return {"tie_word_embeddings": bool(config.get("tie_word_embeddings", False))}


ARCHITECTURE = dict(name="llama", hf_architectures=("LlamaForCausalLM",), hf_model_types=("llama",),
                    features=features, gguf_architecture="llama", gguf_permuted_qk=True)
