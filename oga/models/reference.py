"""Plain numpy forward pass of a decoder: the ground truth the ONNX graphs are checked against.

Written from the model definitions (Hugging Face's LlamaForCausalLM and the architectures of
oga.models.architectures), not from any graph builder: embedding (times embedding_multiplier), per
layer RMSNorm (scale norm_offset + weight) -> Q/K/V (+bias) -> q/k RMSNorm per head (qk_norm) ->
RoPE (rotate_half over the first rotary_dim dimensions; the windowed layers' own base with
local_rope_theta; LongRoPE's short or long factors by the sequence's length) -> causal GQA attention
(scale, softcap, a sliding window on the layers the spec windows: every layer, or only
`sliding_window_layers`) -> o_proj -> (output norm) -> residual (times residual_multiplier) ->
RMSNorm -> gated MLP (SiLU or tanh-GELU) -> (output norm) -> residual; final RMSNorm; LM head (the
embedding when tied), times logits_multiplier, final softcap. Computes in float64 by default.

Hybrid decoders (spec.layer_types) replace the attention block of some layers, token by token:
- "conv": u = h @ in_proj^T; y_t[c] = sum_j w[c, j] u_{t-K+1+j}[c] over the previous K-1 inputs
  (the state [hidden, K-1], oldest first, zeros for a new sequence) and the new ones; out_proj.
- "recurrent": per head S_t = a S_{t-1} + k_t^T v_t, o_t = (q_t / sqrt(head_dim)) S_t,
  a = sigmoid(decay); the state is [heads, head_dim, head_dim]; o_proj.
The Reference keeps each layer's state across step() calls (`fixed_states()`), and the state after
each token of the last step() call (`token_states()`: what a graph's `present.*.per_token` capture
outputs hold for that chunk).
"""

from __future__ import annotations

import math

import numpy as np

from .spec import DecoderSpec, LoadedModel


def rope_inv_freq(spec: DecoderSpec, theta: float | None = None, scaled: bool = True,
                  long: bool = False) -> np.ndarray:
    """Inverse frequencies [rotary_dim / 2] with the spec's rope_scaling applied (HF semantics);
    `theta` another base (Gemma3's windowed layers, which are not scaled: scaled=False); LongRoPE's
    short factors, or with `long` its long ones."""
    d = spec.rotary_dims()
    inv = 1.0 / (theta or spec.rope_theta) ** (np.arange(0, d, 2, dtype=np.float64) / d)
    rs = spec.rope_scaling
    if not rs or not scaled:
        return inv
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rs["factor"])
    if kind == "longrope":
        return inv / np.asarray(rs["long_factor" if long else "short_factor"], dtype=np.float64)
    if kind == "llama3":
        factor = float(rs["factor"])
        low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        original = float(rs["original_max_position_embeddings"])
        wavelen = 2 * np.pi / inv
        low_wl, high_wl = original / low, original / high
        smooth = (original / wavelen - low) / (high - low)
        return np.where(wavelen > low_wl, inv / factor,
                        np.where(wavelen < high_wl, inv,
                                 (1 - smooth) * inv / factor + smooth * inv))
    raise NotImplementedError(f"rope_scaling type {kind!r} is not supported by the reference")


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _long_rope_magnitude(spec: DecoderSpec) -> float:
    """LongRoPE's cos / sin multiplier: sqrt(1 + ln(s) / ln(original)), s = context / original."""
    original = float(spec.rope_scaling["original_max_position_embeddings"])
    ratio = spec.context_length / original
    return 1.0 if ratio <= 1.0 else math.sqrt(1.0 + math.log(ratio) / math.log(original))


class Reference:
    """A decoder with its weights cast once to `dtype`, and an optional KV cache.

    `step(tokens)` appends tokens to the cache and returns their logits, so greedy decoding
    costs one position per new token.
    """

    def __init__(self, loaded: LoadedModel, dtype=np.float64):
        self.spec = loaded.spec
        self.dtype = dtype
        self.w = {k: np.asarray(v, dtype=dtype) for k, v in loaded.weights.items()}
        self.reset()

    def reset(self):
        n = self.spec.num_layers
        self.keys: list[np.ndarray | None] = [None] * n
        self.values: list[np.ndarray | None] = [None] * n
        self.length = 0
        s = self.spec
        # layer -> state of the fixed-state layers (conv [hidden, K-1], recurrent [heads, D, D])
        self.states: dict[int, np.ndarray] = {}
        for i in s.conv_layers():
            self.states[i] = np.zeros((s.hidden_size, int(s.conv_kernel) - 1), dtype=self.dtype)
        for i in s.recurrent_layers():
            self.states[i] = np.zeros((s.num_heads, s.head_dim, s.head_dim), dtype=self.dtype)
        # layer -> [T, *state shape]: the state after each token of the last step() call
        self.per_token: dict[int, np.ndarray] = {}

    def fixed_states(self) -> dict[int, np.ndarray]:
        """Copies of the conv / recurrent states after everything stepped so far, by layer."""
        return {i: v.copy() for i, v in self.states.items()}

    def token_states(self) -> dict[int, np.ndarray]:
        """Copies of the states after every token of the last step() call, by layer: [T, *state shape],
        entry t being what fixed_states() would have returned had that call ended at token t."""
        return {i: v.copy() for i, v in self.per_token.items()}

    def _conv(self, i, h):
        w, p, K = self.w, f"model.layers.{i}.conv.", int(self.spec.conv_kernel)
        u = h @ w[p + "in_proj.weight"].T                                   # [T, C]
        ext = np.concatenate([self.states[i].T, u], axis=0)                  # [K-1+T, C]
        kernel = w[p + "conv.weight"]                                        # [C, K]
        y = np.stack([(ext[t:t + K] * kernel.T).sum(axis=0) for t in range(u.shape[0])])
        # after token t (ext row K-1+t) the state is the K-1 inputs ending there
        self.per_token[i] = np.stack([ext[t + 1:t + K].T for t in range(u.shape[0])])
        self.states[i] = ext[-(K - 1):].T.copy()
        return y @ w[p + "out_proj.weight"].T

    def _recurrent(self, i, h):
        s, w, p = self.spec, self.w, f"model.layers.{i}.linear_attn."
        nH, D = s.num_heads, s.head_dim
        q = (h @ w[p + "q_proj.weight"].T).reshape(-1, nH, D) / math.sqrt(D)
        k = (h @ w[p + "k_proj.weight"].T).reshape(-1, nH, D)
        v = (h @ w[p + "v_proj.weight"].T).reshape(-1, nH, D)
        a = 1.0 / (1.0 + np.exp(-w[p + "decay"]))                           # [nH]
        S = self.states[i]
        out = np.empty_like(q)
        after = np.empty((q.shape[0],) + S.shape, dtype=S.dtype)
        for t in range(q.shape[0]):
            S = a[:, None, None] * S + k[t][:, :, None] * v[t][:, None, :]
            out[t] = np.einsum("hd,hde->he", q[t], S)
            after[t] = S
        self.per_token[i] = after
        self.states[i] = S
        return out.reshape(-1, nH * D) @ w[p + "o_proj.weight"].T

    def step(self, tokens) -> np.ndarray:
        """Logits [len(tokens), V] of `tokens` placed after everything already cached."""
        s, w = self.spec, self.w
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        # token_states() describes this call only, even an empty one
        self.per_token = {i: np.zeros((0,) + v.shape, dtype=self.dtype) for i, v in self.states.items()}
        if tokens.size == 0:
            return np.zeros((0, s.vocab_size), dtype=self.dtype)
        if tokens.min() < 0 or tokens.max() >= s.vocab_size:
            raise ValueError(f"token id outside [0, {s.vocab_size})")
        T, D, nH, nKV = tokens.size, s.head_dim, s.num_heads, s.num_kv_heads
        group = nH // nKV
        total = self.length + T
        pos = np.arange(self.length, total, dtype=np.float64)

        def rotation(inv_freq, magnitude=1.0):
            ang = pos[:, None] * inv_freq[None, :]                           # [T, R/2]
            cos = np.cos(np.concatenate([ang, ang], axis=-1))[:, None, :] * magnitude
            sin = np.sin(np.concatenate([ang, ang], axis=-1))[:, None, :] * magnitude
            return cos.astype(self.dtype), sin.astype(self.dtype)

        if s.long_rope():   # the long factors once the sequence passes the original length
            long = total > int(s.rope_scaling["original_max_position_embeddings"])
            rope = rotation(rope_inv_freq(s, long=long), _long_rope_magnitude(s))
        else:
            rope = rotation(rope_inv_freq(s))
        local_rope = rotation(rope_inv_freq(s, s.local_rope_theta, scaled=False)) if s.local_rope_theta else rope
        R = s.rotary_dims()

        def rotate(x, layer):
            cos, sin = local_rope if s.windowed(layer) else rope
            turned = x[..., :R] * cos + _rotate_half(x[..., :R]) * sin
            return np.concatenate([turned, x[..., R:]], axis=-1)

        def norm(x, name):
            return _rms_norm(x, s.norm_offset + w[name], s.rms_norm_eps)

        def mlp(i, h):
            p = f"model.layers.{i}.mlp."
            gate = h @ w[p + "gate_proj.weight"].T
            up = h @ w[p + "up_proj.weight"].T
            act = _silu(gate) if s.activation == "silu" else _gelu_tanh(gate)
            return (act * up) @ w[p + "down_proj.weight"].T

        def residual(x, i, out, which):
            if s.output_norms:
                out = norm(out, f"model.layers.{i}.{which}_output_norm.weight")
            return x + s.residual_multiplier * out

        qpos = np.arange(self.length, total)[:, None]
        kpos = np.arange(total)[None, :]
        allowed = kpos <= qpos
        mask = np.where(allowed, 0.0, -np.inf).astype(self.dtype)          # [T, total]
        if s.sliding_window:                                                # q - W < k <= q
            window_mask = np.where(allowed & (kpos > qpos - s.sliding_window), 0.0, -np.inf).astype(self.dtype)
        x = w["model.embed_tokens.weight"][tokens] * s.embedding_multiplier   # [T, H]
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            h = norm(x, p + "input_layernorm.weight")
            kind = s.layer_type(i)
            if kind != "attention":
                x = residual(x, i, self._conv(i, h) if kind == "conv" else self._recurrent(i, h), "attention")
                x = residual(x, i, mlp(i, norm(x, p + "post_attention_layernorm.weight")), "mlp")
                continue
            q = h @ w[p + "self_attn.q_proj.weight"].T
            k = h @ w[p + "self_attn.k_proj.weight"].T
            v = h @ w[p + "self_attn.v_proj.weight"].T
            if s.qkv_bias:
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q = q.reshape(T, nH, D)
            k = k.reshape(T, nKV, D)
            v = v.reshape(T, nKV, D)
            if s.qk_norm:
                q = norm(q, p + "self_attn.q_norm.weight")
                k = norm(k, p + "self_attn.k_norm.weight")
            q, k = rotate(q, i), rotate(k, i)
            if self.keys[i] is not None:
                k = np.concatenate([self.keys[i], k], axis=0)
                v = np.concatenate([self.values[i], v], axis=0)
            self.keys[i], self.values[i] = k, v
            # GQA: query head j reads kv head j // group
            kh = np.repeat(k.transpose(1, 0, 2), group, axis=0)            # [nH, total, D]
            vh = np.repeat(v.transpose(1, 0, 2), group, axis=0)
            layer_mask = window_mask if s.windowed(i) else mask
            scores = q.transpose(1, 0, 2) @ kh.transpose(0, 2, 1) * s.scale()
            if s.attention_softcap:
                scores = s.attention_softcap * np.tanh(scores / s.attention_softcap)
            scores = scores + layer_mask
            scores = scores - scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            attn = (probs @ vh).transpose(1, 0, 2).reshape(T, nH * D)
            x = residual(x, i, attn @ w[p + "self_attn.o_proj.weight"].T, "attention")
            x = residual(x, i, mlp(i, norm(x, p + "post_attention_layernorm.weight")), "mlp")
        self.length = total
        x = norm(x, "model.norm.weight")
        head = w["model.embed_tokens.weight"] if s.tie_word_embeddings else w["lm_head.weight"]
        logits = (x @ head.T) * s.logits_multiplier
        if s.final_softcap:
            logits = s.final_softcap * np.tanh(logits / s.final_softcap)
        return logits


def forward(loaded: LoadedModel, tokens, dtype=np.float64) -> np.ndarray:
    """Logits [len(tokens), V] of every position of `tokens` (one sequence from position 0)."""
    return Reference(loaded, dtype).step(tokens)


def forward_with_states(loaded: LoadedModel, tokens, dtype=np.float64, per_token_states: bool = False):
    """(logits [len(tokens), V], {layer: final conv / recurrent state}) of one sequence from position 0;
    with `per_token_states` a third item {layer: [len(tokens), *state shape]}, the state after each token."""
    ref = Reference(loaded, dtype)
    logits = ref.step(tokens)
    if per_token_states:
        return logits, ref.fixed_states(), ref.token_states()
    return logits, ref.fixed_states()


def greedy(loaded: LoadedModel, prompt, n: int, dtype=np.float64,
           eos_token_ids=None) -> list[int]:
    """Up to `n` greedily chosen tokens after `prompt`; stops after emitting an EOS id."""
    eos = set(loaded.spec.eos_token_ids if eos_token_ids is None else eos_token_ids)
    ref = Reference(loaded, dtype)
    out: list[int] = []
    logits = ref.step(list(prompt))
    for _ in range(n):
        tok = int(np.argmax(logits[-1]))
        out.append(tok)
        if tok in eos or len(out) == n:
            break
        logits = ref.step([tok])
    return out
