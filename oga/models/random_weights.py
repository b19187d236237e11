"""Deterministic random weights of a given DecoderSpec, for tests and benchmarks.

Linear weights and the embedding are N(0, 0.02^2) (HF's initializer_range), biases N(0, 0.02^2),
RMSNorm weights 1 + N(0, 0.02^2): activations stay O(1) through the layers, so logits are
well-conditioned and a graph/reference comparison in float32 is meaningful. The same
(spec, seed) always gives bit-identical weights (one numpy PCG64 stream, drawn tensor by tensor
in the spec's fixed name order).

Hybrid layers (spec.layer_types) draw their state-path weights larger so the fixed state visibly
matters: the depthwise conv kernel N(0, 0.5^2), the recurrent q/k/v projections
N(0, 1/hidden_size), and the recurrent decay parameters 1 + N(0, 1) (a = sigmoid(decay), mostly
0.5 .. 0.95). Every other tensor, and every all-attention model, is drawn exactly as before.
"""

from __future__ import annotations

import numpy as np

from .spec import DecoderSpec, LoadedModel

STD = 0.02


def random_model(spec: DecoderSpec, seed: int = 0) -> LoadedModel:
    spec.check()
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in spec.weight_shapes().items():   # insertion order is fixed by the spec
        w = rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)
        if name.endswith("norm.weight"):
            w += np.float32(1.0)
        elif name.endswith("conv.conv.weight"):
            w *= np.float32(0.5 / STD)
        elif name.endswith(("linear_attn.q_proj.weight", "linear_attn.k_proj.weight",
                            "linear_attn.v_proj.weight")):
            w *= np.float32(1.0 / (STD * np.sqrt(spec.hidden_size)))
        elif name.endswith("linear_attn.decay"):
            w = w / np.float32(STD) + np.float32(1.0)
        weights[name] = w
    return LoadedModel(spec=spec, weights=weights, tokenizer_json=None, tokenizer_config=None)


def tiny_spec(**overrides) -> DecoderSpec:
    """A small llama spec (2 layers, hidden 64, GQA 4/2) for fast tests; fields overridable."""
    fields = dict(architecture="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                  num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
                  rope_scaling=None, rms_norm_eps=1e-5, context_length=512,
                  tie_word_embeddings=False, qkv_bias=False, sliding_window=None,
                  bos_token_id=1, eos_token_ids=[2], pad_token_id=0)
    fields.update(overrides)
    return DecoderSpec(**fields)
