"""Decoder model description shared by the loaders, the graph builders and the reference.

A `DecoderSpec` names the shape hyper-parameters and the features of a decoder: the Llama layout
(RMSNorm -> attention -> residual -> RMSNorm -> gated MLP -> residual) and what the architectures of
the registry (oga.models.architectures) change in it: norm offsets, the MLP's activation, q/k norms,
norms on the sub-layers' outputs, embedding / residual / attention / logit multipliers, softcaps,
windows, partial rotary, a second RoPE base for windowed layers, LongRoPE. The defaults are Llama's,
so a feature costs nothing where it is absent. A `LoadedModel` pairs the spec with float32 weights
under oga's canonical names (Hugging Face Llama names, plus those listed in weight_shapes) and
layouts ([out_features, in_features] for linear weights, RoPE in HF's rotate_half convention), plus
the tokenizer files when the source carries them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

LAYER_TYPES = ("attention", "conv", "recurrent")
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass
class DecoderSpec:
    architecture: str            # a name of oga.models.architectures (genai_config's model.type)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: dict | None    # HF rope_scaling dict (e.g. {"rope_type": "llama3", ...}) or None
    rms_norm_eps: float
    context_length: int
    tie_word_embeddings: bool
    qkv_bias: bool               # Qwen2
    sliding_window: int | None   # Mistral (None = full attention)
    bos_token_id: int
    eos_token_ids: list[int]
    pad_token_id: int
    # Layers that attend only to the last `sliding_window` positions (key k is visible to query q
    # iff q - W < k <= q). None: every layer when `sliding_window` is set (Mistral; the paged
    # builders keep them in the full cache and only mask). A list (a proper subset of the layers):
    # only those layers are windowed, and the paged builders keep them in a sliding-window ring
    # (`block_table_windowed`, genai_config's model.decoder.sliding_window); the others attend to
    # the whole sequence.
    sliding_window_layers: list[int] | None = None
    # Hybrid decoders: the kind of each layer, "attention" (paged KV), "conv" (a causal depthwise
    # short convolution whose per-request state is the last conv_kernel - 1 inputs per channel) or
    # "recurrent" (a linear recurrence with a [head_dim, head_dim] matrix state per head,
    # S_t = a S_{t-1} + k_t^T v_t, o_t = q_t S_t / sqrt(head_dim), a = sigmoid of a learned
    # per-head scalar). None: every layer is an attention layer. At least one must be attention.
    layer_types: list[str] | None = None
    conv_kernel: int = 4
    # Features (defaults: Llama's).
    norm_offset: float = 0.0              # RMSNorm scales by (norm_offset + weight): Gemma's 1
    activation: str = "silu"              # the gated MLP's activation: "silu" or "gelu_tanh" (Gemma)
    qk_norm: bool = False                 # RMSNorm of each q / k head before RoPE (Qwen3, Gemma3)
    output_norms: bool = False            # RMSNorm of the attention and MLP outputs before each
                                          # residual add (Gemma2, Gemma3)
    embedding_multiplier: float = 1.0     # embeddings times this (Gemma: sqrt(hidden); Granite)
    residual_multiplier: float = 1.0      # residual + this * sub-layer output (Granite)
    attention_scale: float | None = None  # scores' scale (None: 1 / sqrt(head_dim))
    attention_softcap: float = 0.0        # scores s -> c * tanh(s / c) (Gemma2; 0: none)
    final_softcap: float = 0.0            # logits z -> c * tanh(z / c) (Gemma2; 0: none)
    logits_multiplier: float = 1.0        # logits times this (Granite: 1 / logits_scaling)
    rotary_dim: int | None = None         # dimensions of a head that rotate (None: all; Phi-4-mini)
    local_rope_theta: float | None = None  # the windowed layers' own RoPE base (Gemma3)

    def layer_type(self, layer: int) -> str:
        """"attention", "conv" or "recurrent"."""
        return "attention" if self.layer_types is None else self.layer_types[layer]

    def attention_layers(self) -> list[int]:
        """The layers with a paged KV cache (sorted)."""
        return [i for i in range(self.num_layers) if self.layer_type(i) == "attention"]

    def conv_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.layer_type(i) == "conv"]

    def recurrent_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.layer_type(i) == "recurrent"]

    def hybrid(self) -> bool:
        """Whether any layer keeps fixed per-request state (conv or recurrent) instead of paged KV."""
        return len(self.attention_layers()) != self.num_layers

    def windowed(self, layer: int) -> bool:
        """Whether `layer` attends to a sliding window."""
        if not self.sliding_window:
            return False
        return self.sliding_window_layers is None or layer in self.sliding_window_layers

    def ring_layers(self) -> list[int]:
        """The layers the paged builders keep in a sliding-window ring (sorted; [] = none)."""
        return sorted(self.sliding_window_layers) if self.sliding_window_layers is not None else []

    def features(self) -> list[str]:
        """The features this spec uses beyond the Llama layout (their field names), for builders
        that implement only some of them to refuse the rest by name."""
        defaults = {"norm_offset": 0.0, "activation": "silu", "qk_norm": False, "output_norms": False,
                    "embedding_multiplier": 1.0, "residual_multiplier": 1.0, "attention_scale": None,
                    "attention_softcap": 0.0, "final_softcap": 0.0, "logits_multiplier": 1.0, "rotary_dim": None,
                    "local_rope_theta": None}
        used = [name for name, default in defaults.items() if getattr(self, name) != default]
        if self.long_rope():
            used.append("rope_scaling (longrope)")
        return used

    def rotary_dims(self) -> int:
        """The head dimensions RoPE rotates (the first ones)."""
        return int(self.rotary_dim or self.head_dim)

    def scale(self) -> float:
        """The attention scores' scale."""
        return float(self.attention_scale) if self.attention_scale else 1.0 / float(np.sqrt(self.head_dim))

    def long_rope(self) -> bool:
        """LongRoPE (Phi-3.5, Phi-4-mini): short and long RoPE tables, the long ones for sequences
        longer than rope_scaling's original_max_position_embeddings."""
        return bool(self.rope_scaling) and self.rope_scaling.get("rope_type") == "longrope"

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight name this spec requires, with its HF shape."""
        H, I, V, D = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        q, kv = self.num_heads * D, self.num_kv_heads * D
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (H,)
            kind = self.layer_type(i)
            if kind == "conv":
                shapes[p + "conv.in_proj.weight"] = (H, H)
                shapes[p + "conv.conv.weight"] = (H, int(self.conv_kernel))     # depthwise [channels, K]
                shapes[p + "conv.out_proj.weight"] = (H, H)
            elif kind == "recurrent":
                r = self.num_heads * D
                shapes[p + "linear_attn.q_proj.weight"] = (r, H)
                shapes[p + "linear_attn.k_proj.weight"] = (r, H)
                shapes[p + "linear_attn.v_proj.weight"] = (r, H)
                shapes[p + "linear_attn.decay"] = (self.num_heads,)             # a = sigmoid(decay)
                shapes[p + "linear_attn.o_proj.weight"] = (H, r)
            else:
                shapes[p + "self_attn.q_proj.weight"] = (q, H)
                shapes[p + "self_attn.k_proj.weight"] = (kv, H)
                shapes[p + "self_attn.v_proj.weight"] = (kv, H)
                shapes[p + "self_attn.o_proj.weight"] = (H, q)
                if self.qkv_bias:
                    shapes[p + "self_attn.q_proj.bias"] = (q,)
                    shapes[p + "self_attn.k_proj.bias"] = (kv,)
                    shapes[p + "self_attn.v_proj.bias"] = (kv,)
                if self.qk_norm:
                    shapes[p + "self_attn.q_norm.weight"] = (D,)
                    shapes[p + "self_attn.k_norm.weight"] = (D,)
            if self.output_norms:
                # the attention (or conv / recurrent) output's norm, then the MLP output's
                shapes[p + "attention_output_norm.weight"] = (H,)
                shapes[p + "mlp_output_norm.weight"] = (H,)
            shapes[p + "post_attention_layernorm.weight"] = (H,)
            shapes[p + "mlp.gate_proj.weight"] = (I, H)
            shapes[p + "mlp.up_proj.weight"] = (I, H)
            shapes[p + "mlp.down_proj.weight"] = (H, I)
        shapes["model.norm.weight"] = (H,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (V, H)
        return shapes

    def check(self) -> None:
        """Raise ValueError when the hyper-parameters are inconsistent."""
        from . import architectures
        if self.architecture not in architectures.REGISTRY:
            raise ValueError(f"unsupported architecture {self.architecture!r}; "
                             f"expected one of {', '.join(architectures.REGISTRY)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        for name in ("embedding_multiplier", "residual_multiplier", "logits_multiplier"):
            if not np.isfinite(getattr(self, name)) or getattr(self, name) == 0:
                raise ValueError(f"{name} must be finite and nonzero, got {getattr(self, name)}")
        for name in ("attention_softcap", "final_softcap"):
            if not np.isfinite(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be finite and >= 0 (0: none), got {getattr(self, name)}")
        if self.attention_scale is not None and not (np.isfinite(self.attention_scale) and self.attention_scale > 0):
            raise ValueError(f"attention_scale must be positive (None: 1 / sqrt(head_dim)), got {self.attention_scale}")
        if self.rotary_dim is not None and not (0 < int(self.rotary_dim) <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ValueError(f"rotary_dim must be even and in (0, head_dim={self.head_dim}], got {self.rotary_dim}")
        if self.local_rope_theta is not None and not self.sliding_window:
            raise ValueError("local_rope_theta (the windowed layers' RoPE base) needs a sliding_window")
        if self.long_rope():
            for key in ("short_factor", "long_factor", "original_max_position_embeddings"):
                if key not in self.rope_scaling:
                    raise ValueError(f"LongRoPE rope_scaling lacks {key}")
            for key in ("short_factor", "long_factor"):
                if len(self.rope_scaling[key]) != self.rotary_dims() // 2:
                    raise ValueError(f"LongRoPE {key} has {len(self.rope_scaling[key])} entries; rotary_dim "
                                     f"{self.rotary_dims()} needs {self.rotary_dims() // 2}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "context_length"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window is not None and int(self.sliding_window) <= 0:
            raise ValueError(f"sliding_window must be positive or None, got {self.sliding_window}")
        if self.sliding_window_layers is not None:
            layers = [int(i) for i in self.sliding_window_layers]
            if not self.sliding_window:
                raise ValueError("sliding_window_layers needs a sliding_window (the window size)")
            if not layers:
                raise ValueError("sliding_window_layers must name at least one layer "
                                 "(None windows every layer)")
            if len(set(layers)) != len(layers):
                raise ValueError(f"sliding_window_layers has duplicates: {self.sliding_window_layers}")
            outside = [i for i in layers if not 0 <= i < self.num_layers]
            if outside:
                raise ValueError(f"sliding_window_layers {outside} outside the decoder layers "
                                 f"[0, {self.num_layers})")
            if len(layers) == self.num_layers:
                raise ValueError("sliding_window_layers names every layer; a ring-cached model needs at "
                                 "least one layer that keeps the whole sequence (leave sliding_window_layers "
                                 "None to window every layer over the full cache)")
        if self.layer_types is not None:
            kinds = list(self.layer_types)
            if len(kinds) != self.num_layers:
                raise ValueError(f"layer_types names {len(kinds)} layers; the decoder has {self.num_layers}")
            unknown = sorted({k for k in kinds if k not in LAYER_TYPES})
            if unknown:
                raise ValueError(f"layer_types has unknown kinds {unknown}; expected one of {LAYER_TYPES}")
            if "attention" not in kinds:
                raise ValueError("layer_types needs at least one 'attention' layer (the paged KV cache)")
            if self.sliding_window_layers is not None:
                bad = sorted(i for i in self.sliding_window_layers if 0 <= i < self.num_layers
                             and kinds[i] != "attention")
                if bad:
                    raise ValueError(f"sliding_window_layers {bad} are not attention layers")
                if set(self.sliding_window_layers) >= set(self.attention_layers()):
                    raise ValueError("sliding_window_layers names every attention layer; a ring-cached model "
                                     "needs at least one layer that keeps the whole sequence")
        if int(self.conv_kernel) < 2:
            raise ValueError(f"conv_kernel must be at least 2, got {self.conv_kernel}")
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids must not be empty")
        for name, tok in [("bos_token_id", self.bos_token_id), ("pad_token_id", self.pad_token_id)] + \
                [("eos_token_ids", t) for t in self.eos_token_ids]:
            if not 0 <= tok < self.vocab_size:
                raise ValueError(f"{name} {tok} outside the vocabulary [0, {self.vocab_size})")

    def validate(self, weights: dict[str, np.ndarray]) -> None:
        """Check `weights` against this spec; raise ValueError listing every problem."""
        self.check()
        expected = self.weight_shapes()
        problems = []
        for name, shape in expected.items():
            w = weights.get(name)
            if w is None:
                problems.append(f"missing {name} {shape}")
            elif tuple(w.shape) != shape:
                problems.append(f"{name}: shape {tuple(w.shape)}, expected {shape}")
            elif w.dtype != np.float32:
                problems.append(f"{name}: dtype {w.dtype}, expected float32")
        for name in sorted(set(weights) - set(expected)):
            problems.append(f"unexpected weight {name} {tuple(weights[name].shape)}")
        if problems:
            raise ValueError(f"weights do not match the {self.architecture} spec "
                             f"({len(problems)} problem(s)):\n  " + "\n  ".join(problems))


@dataclass
class LoadedModel:
    spec: DecoderSpec
    weights: dict[str, np.ndarray]   # float32, Hugging Face names and layouts
    tokenizer_json: str | None = None       # tokenizers-package JSON text
    tokenizer_config: dict | None = field(default=None)  # chat_template, bos/eos/pad/unk tokens
    # Weights the source stores in a block format MatMulNBits holds exactly (GGUF Q4_0 / Q4_1 /
    # Q8_0), by HF name: oga.models.quantize.BlockQuantized, the same values as `weights`.
    blocks: dict = field(default_factory=dict)

    def validate(self) -> None:
        self.spec.validate(self.weights)
