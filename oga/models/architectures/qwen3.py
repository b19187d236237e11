"""Qwen3: a Llama with an RMSNorm on each query and key head before RoPE (q_norm, k_norm)."""


def features(config: dict) -> dict:
    window = config.get("sliding_window") if config.get("use_sliding_window", False) else None
    return {"qk_norm": True, "sliding_window": int(window) if window else None}


ARCHITECTURE = dict(name="qwen3", hf_architectures=("Qwen3ForCausalLM",), hf_model_types=("qwen3",),
                    features=features)
