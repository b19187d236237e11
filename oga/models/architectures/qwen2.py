"""Qwen2 / Qwen2.5: a Llama with q/k/v biases (a window only when use_sliding_window is set)."""


def features(config: dict) -> dict:
    window = config.get("sliding_window") if config.get("use_sliding_window", False) else None
    return {"qkv_bias": True, "sliding_window": int(window) if window else None}


ARCHITECTURE = dict(name="qwen2", hf_architectures=("Qwen2ForCausalLM",), hf_model_types=("qwen2",),
                    features=features, gguf_architecture="qwen2", gguf_permuted_qk=False)
