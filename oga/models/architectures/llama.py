"""Llama (and SmolLM, which is a Llama): the canonical layout every other architecture is described
against (RMSNorm, SiLU-gated MLP, RoPE on whole heads). llama.cpp's converter permutes its q/k rows
for llama.cpp's interleaved RoPE."""


def features(config: dict) -> dict:
    return {"tie_word_embeddings": bool(config.get("tie_word_embeddings", False))}


def gguf_features(metadata) -> dict:
    # llama.cpp's converter writes no window for Llama; a file that has one (attention.sliding_window)
    # is read as Mistral (mistral.py), which llama.cpp also stores as "llama".
    window = metadata.get("attention.sliding_window")
    return {"sliding_window": int(window) if window else None}


ARCHITECTURE = dict(name="llama", hf_architectures=("LlamaForCausalLM",), hf_model_types=("llama",),
                    features=features, gguf_architecture="llama", gguf_permuted_qk=True,
                    gguf_features=gguf_features)
