"""CPU decoder graph with fused kernels: the paged contract of onnx_cpu.py, few nodes, no gathers.

The inputs, outputs and cache binding are exactly those of the standard-op graph (onnx_cpu.py's
module docstring): packed input_ids, cumulative_sequence_lengths, past_sequence_lengths,
block_table (and block_table_windowed), attention_metadata (declared, not read), optional
logits_indices, caches [num_blocks, block_size, kv_heads, head_dim] whose present_* outputs alias
the past_* inputs. What differs is inside:

    embeddings   Gather (fp32) or com.microsoft.GatherBlockQuantized (8-bit: a GGUF Q8_0 table as is)
    per layer    oga.SkipRMSNorm (residual add + RMSNorm in one kernel, the sum passed on as the
                 next residual; it also adds the block offsets of the linear before it)
                 q|k|v projection: one linear (see linear_weights.py: fp32 Gemm; a quantized weight
                 oga.QuantizedLinear at accuracy_level 4, the default, else MatMulNBits)
                 oga.PagedGroupQueryAttention: RoPE, the cache write and attention over the block
                 table in one kernel that reads the cache blocks in place (ortops/)
                 o_proj, oga.SkipRMSNorm, gate|up projection, oga.SwiGlu (SiLU(gate) * up),
                 down_proj
    head         the rows that need logits, oga.SkipRMSNorm, LM head: oga.LogitsHead for a float
                 weight (the logits and each row's maximum per block of 1024 logits, a second
                 output, logits_block_maxima, that greedy selection reads), else the quantized
                 linear

Architecture features (DecoderSpec, oga.models.architectures) fold into this shape: a norm offset
into the norms' weights, multipliers into Mul nodes on the embeddings, the residual branches and the
logits (and on the block maxima, which stay the maxima of the logits: every post-head op is monotonic),
q/k norms as oga.SkipRMSNorm over [tokens x heads, head_dim] between the q|k|v projection and the
attention (which then takes q, k, v apart), output norms as an oga.SkipRMSNorm without residual,
tanh-GELU as com.microsoft.FastGelu, the attention's scale, softcap, window, per-layer RoPE tables
(a local base for windowed layers) and LongRoPE's two tables as attributes and inputs of
oga.PagedGroupQueryAttention, the final softcap as Div, Tanh, Mul after the head.

A decode-only step runs no prefill branch (the attention kernel handles each row by its length)
and gathers nothing: its cost grows with context only by the keys and values it reads.

The graph needs oga's ONNX Runtime operator library (oga.ortops.library_path()): oga's executor
registers it; onnxruntime-genai 0.18 cannot load this graph (build graph="standard" for that).
Sliding-window layers pass their window to the attention kernel (ring layers with
block_table_windowed); hybrid decoders keep their conv / recurrent layers in the standard ops of
onnx_cpu.py (fp32), with the same fused norms around them.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from . import linear_weights as lw
from . import onnx_cpu as cpu
from .onnx_cpu import GraphBuilder, _w, rope_tables
from .spec import DecoderSpec

OGA_DOMAIN = "oga"                   # oga's operators (ortops/register_ops.cpp)
# oga.LogitsHead's second output, bound by oga's executors (oga/executor/contract.py), and its block
# (ortops/logits_head.h kLogitsBlock, OGA_EXT_LOGITS_BLOCK in include/oga/oga_ext.h)
LOGITS_BLOCK_MAXIMA = "logits_block_maxima"
LOGITS_BLOCK = 1024
MS_DOMAIN = lw.MS_DOMAIN


def _norm(g: GraphBuilder, x: str, residual: str | None, weight: str, eps: float, hint: str,
          offsets: list[str] | None = None):
    """(RMSNorm(x (+ block offsets) (+ residual)) * weight, that sum) with one oga.SkipRMSNorm."""
    base = g._unique(hint)
    return g.op("SkipRMSNorm", [x, residual or "", weight] + (offsets or []), hint,
                outputs=[f"{base}/output", f"{base}/sum"], domain=OGA_DOMAIN, epsilon=float(eps))


def _norm_weight(g: GraphBuilder, spec: DecoderSpec, weights, name: str) -> str:
    """A norm's scale as an initializer: the weight, plus the spec's norm offset (Gemma's 1 + w)."""
    w = _w(weights, name)
    return g.initializer(name, w + np.float32(spec.norm_offset) if spec.norm_offset else w)


def _scaled(g: GraphBuilder, x: str, factor: float, hint: str) -> str:
    return x if factor == 1.0 else g.op("Mul", [x, g.const(np.float32(factor), np.float32)], hint)


def _head_norm(g: GraphBuilder, spec: DecoderSpec, weights, x: str, heads: int, name: str, hint: str) -> str:
    """RMSNorm of each head of x [tokens, heads x head_dim] (q / k norm), as [tokens x heads, head_dim]."""
    rows = g.reshape(x, g.const([-1, spec.head_dim]))
    normed, _ = _norm(g, rows, None, _norm_weight(g, spec, weights, name), spec.rms_norm_eps, hint)
    return g.reshape(normed, g.const([-1, heads * spec.head_dim]))


class _Weights:
    """The decoder's linears at the build's precision (linear_weights.choose / fuse)."""

    def __init__(self, spec: DecoderSpec, weights, blocks, precision):
        self.spec, self.weights, self.blocks, self.precision = spec, weights, blocks, precision
        self.kinds: set[str] = set()      # forms chosen so far ("fp32", "int4", "int8")

    def linear(self, name: str, bits: int | None = None) -> lw.Linear:
        chosen = lw.choose(name, _w(self.weights, name), self.blocks, self.precision, bits)
        self.kinds.add(chosen.kind)
        return chosen

    def fused(self, name: str, parts: list[str]) -> list[lw.Linear]:
        return lw.fuse(name, [self.linear(p) for p in parts])


def _oga_linear(linear: lw.Linear, accuracy: int) -> bool:
    """Whether `linear` is computed by oga.QuantizedLinear (a quantized weight at its accuracy level)."""
    return linear.quantized is not None and accuracy == lw.OGA_LINEAR_ACCURACY_LEVEL


def _matmul(g: GraphBuilder, x: str, linear: lw.Linear, accuracy: int, hint: str, output: str | None = None):
    """(y, pending block offsets or None) of x @ W^T: oga.QuantizedLinear for a quantized weight at its
    accuracy level (offsets included, none pending), else linear_weights.emit_matmul."""
    if _oga_linear(linear, accuracy):
        return lw.emit_oga_linear(g, x, linear, hint, output=output), None
    return lw.emit_matmul(g, x, linear, accuracy, hint, output=output)


def _linear(g: GraphBuilder, x: str, linear: lw.Linear, accuracy: int, hint: str, bias: str | None = None,
            output: str | None = None) -> str:
    """x @ W^T (+ bias) complete (no pending offsets), as _matmul chooses, else linear_weights.emit."""
    if _oga_linear(linear, accuracy):
        y = lw.emit_oga_linear(g, x, linear, hint, output=output if bias is None else None)
        return y if bias is None else g.op("Add", [y, bias], f"{hint}/bias", outputs=[output] if output else None)
    return lw.emit(g, x, linear, accuracy, hint, bias=bias, output=output)


def _normed_matmul(g: GraphBuilder, stream, norm_weight: str, eps: float, norm_hint: str, linear: lw.Linear,
                   accuracy: int, hint: str):
    """linear(RMSNorm(x (+ offsets) (+ residual)) * norm_weight) for the residual stream (x, offsets,
    residual): one oga.QuantizedLinear with the norm inside when the linear is oga's and x has no
    pending offsets, else oga.SkipRMSNorm and _matmul. Returns (y, y's pending offsets, new residual)."""
    x, offsets, residual = stream
    if _oga_linear(linear, accuracy) and not offsets:
        y, total = lw.emit_oga_linear(g, x, linear, hint, skip=residual, gamma=norm_weight, epsilon=eps,
                                      want_sum=True)
        return y, None, total
    h, residual = _norm(g, x, residual, norm_weight, eps, norm_hint, offsets)
    y, pending = _matmul(g, h, linear, accuracy, hint)
    return y, pending, residual


def _attention(g: GraphBuilder, spec: DecoderSpec, layer: int, stream, norm_weight: str, w: _Weights, accuracy: int,
               rope: list[str], ring: bool):
    """The input norm and the attention block over the residual stream (x, offsets, residual);
    returns the stream after it: (o_proj output, its pending block offsets or None, residual). `rope`:
    the layer's cos, sin tables, and LongRoPE's long ones after them."""
    p = f"model.layers.{layer}.self_attn."
    projections = w.fused(p + "qkv_proj.weight", [p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"])
    biases = [None] * len(projections)
    if spec.qkv_bias:
        parts = [_w(w.weights, p + n) for n in ("q_proj.bias", "k_proj.bias", "v_proj.bias")]
        if len(projections) == 1:
            parts = [np.concatenate(parts)]
        biases = [g.initializer(f"{proj.name}.bias", b) for proj, b in zip(projections, parts)]
    offsets = []
    if len(projections) == 1 and not spec.qk_norm:
        qkv, offsets, residual = _normed_matmul(g, stream, norm_weight, spec.rms_norm_eps, "input_layernorm",
                                                projections[0], accuracy, "qkv_proj")
        if biases[0] is not None:
            qkv = g.op("Add", [qkv, biases[0]], "qkv_proj/bias")
        qkv = [qkv, "", ""]
    else:
        h, residual = _norm(g, stream[0], stream[2], norm_weight, spec.rms_norm_eps, "input_layernorm", stream[1])
        if len(projections) == 1:   # q / k norms: q, k and v apart
            qkv = _linear(g, h, projections[0], accuracy, "qkv_proj", bias=biases[0])
            q_width, kv_width = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
            qkv = g.op("Split", [qkv, g.const([q_width, kv_width, kv_width])], "qkv_proj/split", n_out=3, axis=-1)
        else:   # q, k, v in different forms (e.g. a GGUF mixing Q4_1 and Q8_0): three linears
            qkv = [_linear(g, h, proj, accuracy, proj.name.rsplit(".", 2)[-2], bias=b)
                   for proj, b in zip(projections, biases)]
    if spec.qk_norm:
        qkv = [_head_norm(g, spec, w.weights, qkv[0], spec.num_heads, p + "q_norm.weight", "q_norm"),
               _head_norm(g, spec, w.weights, qkv[1], spec.num_kv_heads, p + "k_norm.weight", "k_norm"), qkv[2]]
    window = int(spec.sliding_window) if spec.windowed(layer) else -1
    table = cpu.BLOCK_TABLE_WINDOWED if ring else cpu.BLOCK_TABLE
    inputs = qkv + [cpu.PAST_KEY % layer, cpu.PAST_VALUE % layer, table, cpu.CU_SEQLENS, cpu.PAST_SEQLENS] + rope[:2]
    inputs += (offsets or ["", ""])
    long_rope = {}
    if len(rope) == 4:   # LongRoPE: the long tables past the original length, per row
        inputs += [""] + rope[2:]
        long_rope["rope_switch_length"] = int(spec.rope_scaling["original_max_position_embeddings"])
    while not inputs[-1]:
        inputs.pop()
    attn = g.op("PagedGroupQueryAttention", inputs,
                "PagedGroupQueryAttention", outputs=[g._unique("attention"), cpu.PRESENT_KEY % layer,
                                                     cpu.PRESENT_VALUE % layer],
                domain=OGA_DOMAIN, num_heads=spec.num_heads, kv_num_heads=spec.num_kv_heads,
                scale=spec.scale(), do_rotary=1, rotary_interleaved=0, local_window_size=window,
                softcap=float(spec.attention_softcap), **long_rope)[0]
    y, pending = _sublayer_output(g, spec, w, layer, attn, w.linear(p + "o_proj.weight"), accuracy, "o_proj",
                                  "attention")
    return y, pending, residual


def _sublayer_output(g: GraphBuilder, spec: DecoderSpec, w: _Weights, layer: int, x: str, linear: lw.Linear,
                     accuracy: int, hint: str, which: str, swiglu: bool = False):
    """A sub-layer's output projection as the next norm takes it: (y, its pending block offsets or
    None), with the output norm (Gemma2/3) and the residual multiplier (Granite) applied. `swiglu`:
    x is gate|up and oga.QuantizedLinear applies the SwiGLU inside."""
    if swiglu:
        y, offsets = lw.emit_oga_linear(g, x, linear, hint, swiglu=True), None
    elif spec.output_norms:                   # the norm adds the projection's block offsets
        y, offsets = _matmul(g, x, linear, accuracy, hint)
    elif spec.residual_multiplier != 1.0:     # complete, before the multiplier
        y, offsets = _linear(g, x, linear, accuracy, hint), None
    else:
        return _matmul(g, x, linear, accuracy, hint)
    if spec.output_norms:
        name = f"model.layers.{layer}.{which}_output_norm.weight"
        y, _ = _norm(g, y, None, _norm_weight(g, spec, w.weights, name), spec.rms_norm_eps, f"{which}_output_norm",
                     offsets)
    return _scaled(g, y, spec.residual_multiplier, f"{which}/residual_multiplier"), None


def _mlp(g: GraphBuilder, spec: DecoderSpec, layer: int, stream, norm_weight: str, w: _Weights, accuracy: int):
    """The post-attention norm and the MLP over the residual stream; returns the stream after it
    (down_proj output, its pending block offsets or None, residual). With oga's linears and a SiLU
    gate that is two nodes: norm + gate|up, then SwiGLU + down."""
    p = f"model.layers.{layer}.mlp."
    projections = w.fused(p + "gate_up_proj.weight", [p + "gate_proj.weight", p + "up_proj.weight"])
    down = w.linear(p + "down_proj.weight")
    if len(projections) == 1 and spec.activation == "silu":
        gate_up, offsets, residual = _normed_matmul(g, stream, norm_weight, spec.rms_norm_eps,
                                                    "post_attention_layernorm", projections[0], accuracy,
                                                    "gate_up_proj")
        if not offsets and _oga_linear(down, accuracy):
            y, pending = _sublayer_output(g, spec, w, layer, gate_up, down, accuracy, "down_proj", "mlp", swiglu=True)
            return y, pending, residual
        act = g.op("SwiGlu", [gate_up] + (offsets or []), "SwiGlu", domain=OGA_DOMAIN)
    else:
        h, residual = _norm(g, stream[0], stream[2], norm_weight, spec.rms_norm_eps, "post_attention_layernorm",
                            stream[1])
        if len(projections) == 1:
            gate_up = _linear(g, h, projections[0], accuracy, "gate_up_proj")
            gate, up = g.op("Split", [gate_up, g.const([spec.intermediate_size] * 2)], "gate_up_proj/split",
                            n_out=2, axis=-1)
        else:
            gate, up = (_linear(g, h, proj, accuracy, hint) for proj, hint in zip(projections, ("gate_proj", "up_proj")))
        if spec.activation == "gelu_tanh":
            activated = g.op("FastGelu", [gate], "gelu_tanh", domain=MS_DOMAIN)
        else:
            activated = g.op("Mul", [gate, g.op("Sigmoid", [gate], "silu/Sigmoid")], "silu/Mul")
        act = g.op("Mul", [activated, up], "gated")
    y, pending = _sublayer_output(g, spec, w, layer, act, down, accuracy, "down_proj", "mlp")
    return y, pending, residual


def _embeddings(g: GraphBuilder, spec: DecoderSpec, w: _Weights) -> str:
    name = "model.embed_tokens.weight"
    table = w.blocks.get(name)
    if w.precision != "fp32" and table is not None and table.bits == 8 and table.zero_points is None:
        # the 8-bit table as is (GGUF Q8_0): codes [vocab, hidden], one scale per block of 32
        x = g.op("GatherBlockQuantized",
                 [g.initializer(name + ".codes", table.codes.reshape(table.n, table.k)), cpu.INPUT_IDS,
                  g.initializer(name + ".scales", np.ascontiguousarray(table.scales))],
                 "embed_tokens/GatherBlockQuantized", domain=MS_DOMAIN, gather_axis=0, quantize_axis=1,
                 block_size=table.block_size, bits=8)
    else:
        x = g.op("Gather", [g.initializer(name, _w(w.weights, name)), cpu.INPUT_IDS], "embed_tokens/Gather", axis=0)
    return _scaled(g, x, spec.embedding_multiplier, "embed_tokens/multiplier")


def _logits_postprocess(g: GraphBuilder, spec: DecoderSpec, x: str, hint: str, output: str | None = None) -> str:
    """The logit multiplier and the final softcap (c * tanh(z / c)) on x: monotonic, elementwise."""
    steps = []
    if spec.logits_multiplier != 1.0:
        steps.append(("Mul", np.float32(spec.logits_multiplier)))
    if spec.final_softcap:
        steps += [("Div", np.float32(spec.final_softcap)), ("Tanh", None), ("Mul", np.float32(spec.final_softcap))]
    for i, (op, value) in enumerate(steps):
        inputs = [x] if value is None else [x, g.const(value, np.float32)]
        last = i == len(steps) - 1
        x = g.op(op, inputs, f"{hint}/{op}", outputs=[output] if last and output else None)
    return x


def _lm_head(g: GraphBuilder, spec: DecoderSpec, x: str, offsets, residual: str, w: _Weights, accuracy: int,
             per_token_logits: bool, logits_indices: bool):
    g.scope = "lm_head"
    if logits_indices:
        rows = cpu.LOGITS_INDICES
    elif not per_token_logits:
        rows = g.op("Sub", [g.op("Slice", [cpu.CU_SEQLENS, g.const([1]), g.const([2**62])]), g.const(1, np.int32)],
                    "last_tokens")
    else:
        rows = None
    if rows is not None:
        x = g.op("Gather", [x, rows], "select_rows/x", axis=0)
        residual = g.op("Gather", [residual, rows], "select_rows/residual", axis=0)
        if offsets:
            offsets = [g.op("Gather", [offsets[0], rows], "select_rows/offset_input", axis=0), offsets[1]]
    norm = _norm_weight(g, spec, w.weights, "model.norm.weight")
    post = spec.logits_multiplier != 1.0 or bool(spec.final_softcap)
    head_name = "model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
    head = w.linear(head_name, bits=None if w.precision is None else 8)
    if _oga_linear(head, accuracy) and not offsets:
        head.name = "lm_head.weight"     # the final norm inside the head's node
        logits = lw.emit_oga_linear(g, x, head, "lm_head", output=None if post else cpu.LOGITS, skip=residual,
                                    gamma=norm, epsilon=spec.rms_norm_eps)
        if post:
            _logits_postprocess(g, spec, logits, "logits", cpu.LOGITS)
        return
    normed, _ = _norm(g, x, residual, norm, spec.rms_norm_eps, "norm", offsets)
    if head.quantized is None:
        # A float head: oga.LogitsHead, which also writes each row's block maxima while the logits are
        # in cache (the engine's greedy selection reads those instead of the whole row). A tied head
        # shares the embedding's initializer.
        if not (spec.tie_word_embeddings and _has_initializer(g, head_name)):
            head_name = g.initializer("lm_head.weight", np.ascontiguousarray(head.weight, dtype=np.float32))
        rows = cpu.logits_rows(per_token_logits, logits_indices)
        g.output(LOGITS_BLOCK_MAXIMA, TensorProto.FLOAT, [rows, -(-spec.vocab_size // LOGITS_BLOCK)])
        outputs = ["lm_head/logits", "lm_head/maxima"] if post else [cpu.LOGITS, LOGITS_BLOCK_MAXIMA]
        g.op("LogitsHead", [normed, head_name], "lm_head", outputs=outputs, domain=OGA_DOMAIN)
        if post:   # the same ops on the maxima keep them the block maxima of the final logits
            _logits_postprocess(g, spec, outputs[0], "logits", cpu.LOGITS)
            _logits_postprocess(g, spec, outputs[1], "maxima", LOGITS_BLOCK_MAXIMA)
        return
    head.name = "lm_head.weight"
    logits = _linear(g, normed, head, accuracy, "lm_head", output=None if post else cpu.LOGITS)
    if post:
        _logits_postprocess(g, spec, logits, "logits", cpu.LOGITS)


def _has_initializer(g: GraphBuilder, name: str) -> bool:
    return any(t.name == name for t in g.initializers)


KV_CACHE_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def default_kv_cache(blocks, precision) -> str:
    """float16 KV caches when the linear weights are quantized (a GGUF's own blocks, int4, int8),
    float32 when they are not: reduced precision only where the weights already have it."""
    quantized = precision in ("int4", "int8") or (precision is None and bool(blocks))
    return "float16" if quantized else "float32"


def build_cpu_fused_graph(spec: DecoderSpec, weights, *, blocks=None, precision=None,
                          accuracy_level: int = lw.DEFAULT_ACCURACY_LEVEL, block_size: int = 16,
                          context_length: int, per_token_logits: bool = False, logits_indices: bool = False,
                          state_capture: bool | None = None, kv_cache: str | None = None):
    """The fused paged decoder as an in-memory ModelProto (see the module docstring). `blocks`: the
    source's exact block-quantized weights (LoadedModel.blocks); `precision` as in
    linear_weights.py; `context_length` sizes the RoPE tables; `kv_cache` "float16" or "float32"
    (None: default_kv_cache)."""
    spec.check()
    lw.check_precision(precision)
    lw.check_accuracy_level(accuracy_level)
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    kv_cache = kv_cache or default_kv_cache(blocks, precision)
    if kv_cache not in KV_CACHE_TYPES:
        raise ValueError(f"kv_cache must be float16 or float32, got {kv_cache!r}")
    capture = cpu.default_state_capture(spec, per_token_logits, state_capture)
    g = GraphBuilder()
    cpu.declare_io(g, spec, block_size, KV_CACHE_TYPES[kv_cache], TensorProto.FLOAT, per_token_logits,
                   logits_indices, state_capture=capture, fixed_state_type=TensorProto.FLOAT)
    w = _Weights(spec, weights, blocks or {}, precision)
    rope = [g.initializer(f"rotary/{n}_cache", t) for n, t in zip(("cos", "sin"),
                                                                    rope_tables(spec, int(context_length), np.float32))]
    if spec.long_rope():
        rope += [g.initializer(f"rotary/{n}_cache_long", t) for n, t in zip(
            ("cos", "sin"), rope_tables(spec, int(context_length), np.float32, long=True))]
    local_rope = rope
    if spec.local_rope_theta:
        local_rope = [g.initializer(f"rotary/{n}_cache_local", t) for n, t in zip(
            ("cos", "sin"), rope_tables(spec, int(context_length), np.float32, local=True))]
    ring = set(spec.ring_layers())
    fixed = cpu._fixed_indices(g) if spec.hybrid() else None

    g.scope = ""
    # The residual stream is carried as (pending sub-layer output x, its block offsets, the residual
    # before x is added): every norm adds them in one oga.SkipRMSNorm.
    x, offsets, residual = _embeddings(g, spec, w), None, None
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        kind = spec.layer_type(i)
        g.scope = f"layers.{i}/" + {"attention": "attn", "conv": "conv", "recurrent": "recurrent"}[kind]
        ln1 = _norm_weight(g, spec, weights, p + "input_layernorm.weight")
        if kind == "attention":
            layer_rope = local_rope if spec.windowed(i) else rope
            x, offsets, residual = _attention(g, spec, i, (x, offsets, residual), ln1, w, accuracy_level, layer_rope,
                                              ring=i in ring)
        else:
            h, residual = _norm(g, x, residual, ln1, spec.rms_norm_eps, "input_layernorm", offsets)
            if kind == "conv":
                x = cpu._conv_layer(g, spec, i, h, fixed, weights, capture=capture)
            else:
                x = cpu._recurrent_layer(g, spec, i, h, fixed, weights, capture=capture)
            offsets = None
        g.scope = f"layers.{i}/mlp"
        ln2 = _norm_weight(g, spec, weights, p + "post_attention_layernorm.weight")
        x, offsets, residual = _mlp(g, spec, i, (x, offsets, residual), ln2, w, accuracy_level)
    _lm_head(g, spec, x, offsets, residual, w, accuracy_level, per_token_logits, logits_indices)
    doc = (f"oga.models fused CPU paged decoder ({spec.architecture}, block_size {block_size}, "
           f"linear weights {'/'.join(sorted(w.kinds))}, accuracy_level {accuracy_level}, {kv_cache} KV cache")
    if ring:
        doc += f", sliding-window ring layers {sorted(ring)} of window {spec.sliding_window}"
    if spec.hybrid():
        doc += f", layer types {list(spec.layer_types)}"
    return g.model("oga_paged_decoder_cpu_fused", [("", cpu.OPSET), (MS_DOMAIN, 1), (OGA_DOMAIN, 1)], doc=doc + ")")

