"""Mistral: a Llama whose every layer may attend to a sliding window (config.json `sliding_window`)."""


def features(config: dict) -> dict:
    window = config.get("sliding_window")
    return {"sliding_window": int(window) if window else None,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False))}


ARCHITECTURE = dict(name="mistral", hf_architectures=("MistralForCausalLM",), hf_model_types=("mistral",),
                    features=features, gguf_architecture=None, gguf_permuted_qk=True)
