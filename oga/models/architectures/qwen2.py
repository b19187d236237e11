"""Qwen2 / Qwen2.5: a Llama with q/k/v biases (a window only when use_sliding_window is set).
llama.cpp runs it with NeoX RoPE, so its GGUF q/k rows are stored unpermuted."""


def features(config: dict) -> dict:
    window = config.get("sliding_window") if config.get("use_sliding_window", False) else None
    return {"qkv_bias": True, "sliding_window": int(window) if window else None}


def gguf_features(metadata) -> dict:
    # The biases are read from the file (attn_q.bias present); its converter writes no window, a
    # file that carries one keeps it.
    window = metadata.get("attention.sliding_window")
    return {"sliding_window": int(window) if window else None}


ARCHITECTURE = dict(name="qwen2", hf_architectures=("Qwen2ForCausalLM",), hf_model_types=("qwen2",),
                    features=features, gguf_architecture="qwen2", gguf_permuted_qk=False,
                    gguf_features=gguf_features)
