"""Qwen3: a Llama with an RMSNorm on each query and key head before RoPE (q_norm, k_norm); in GGUF
files (NeoX RoPE: q/k rows unpermuted) those are attn_q_norm / attn_k_norm."""


def features(config: dict) -> dict:
    window = config.get("sliding_window") if config.get("use_sliding_window", False) else None
    return {"qk_norm": True, "sliding_window": int(window) if window else None}


GGUF_TENSOR_NAMES = {"attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight"}


def gguf_features(metadata) -> dict:
    window = metadata.get("attention.sliding_window")
    return {"qk_norm": True, "sliding_window": int(window) if window else None}


ARCHITECTURE = dict(name="qwen3", hf_architectures=("Qwen3ForCausalLM",), hf_model_types=("qwen3",),
                    features=features, gguf_architecture="qwen3", gguf_permuted_qk=False,
                    gguf_tensor_names=GGUF_TENSOR_NAMES, gguf_features=gguf_features)
