"""Mistral: a Llama whose every layer may attend to a sliding window (config.json `sliding_window`).
llama.cpp stores it as "llama" (q/k permuted); a "llama" file with a window is read as Mistral."""

from . import llama


def features(config: dict) -> dict:
    window = config.get("sliding_window")
    return {"sliding_window": int(window) if window else None,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False))}


def _windowed(fields: dict) -> bool:
    return fields.get("sliding_window") is not None


ARCHITECTURE = dict(name="mistral", hf_architectures=("MistralForCausalLM",), hf_model_types=("mistral",),
                    features=features, gguf_architecture="llama", gguf_when=_windowed, gguf_permuted_qk=True,
                    gguf_features=llama.gguf_features)
