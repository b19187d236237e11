"""CUDA decoder graph: fp16 weights and activations, attention by `com.microsoft::PagedAttention`.

Same input/output contract as the CPU graph (see onnx_cpu.py) and as OGA 0.18's builder output
with `use_paged_attention=true` (seed "One dynamic step in detail", step 8): packed `input_ids`,
`cumulative_sequence_lengths`, `past_sequence_lengths`, `block_table`, `attention_metadata` (int32[3],
CPU memory), per-layer fp16 caches `[num_blocks, block_size, kv_heads, head_dim]` that
PagedAttention updates in place (`present.%d.*` alias `past_key_values.%d.*`). RoPE runs inside
PagedAttention (`do_rotary=1`) from fp16 cos/sin tables `[context_length, head_dim / 2]`. Norms are ORT's
`com.microsoft::SkipSimplifiedLayerNormalization` (residual add + RMSNorm in one kernel, fp32
accumulation); only the first layer's input norm, which has no residual to add, is written in
standard ops with an fp32 cast. Logits are float32 (cast after the fp16 LM head).

There is no CPU kernel for PagedAttention, so this graph cannot run without a GPU; tests check it
with onnx.checker and by loading it into ONNX Runtime's CPU provider, which must stop at
PagedAttention and nowhere else.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from . import onnx_cpu as cpu
from .onnx_cpu import GraphBuilder, _w, fused_layer_weights, refuse_features, rope_tables
from .spec import DecoderSpec

MS_DOMAIN = "com.microsoft"


def _rms_norm_fp32(g: GraphBuilder, x: str, weight: str, eps: float, hint: str) -> str:
    x32 = g.op("Cast", [x], f"{hint}/Cast", to=TensorProto.FLOAT)
    ms = g.op("ReduceMean", [g.op("Mul", [x32, x32], f"{hint}/Square")], f"{hint}/ReduceMean",
              axes=[-1], keepdims=1)
    inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [ms, g.const(eps, np.float32)])])])
    y = g.op("Cast", [g.op("Mul", [x32, inv], f"{hint}/Scale")], f"{hint}/CastBack", to=TensorProto.FLOAT16)
    return g.op("Mul", [y, weight], f"{hint}/Mul")


def _skip_rms_norm(g: GraphBuilder, x: str, residual: str, weight: str, eps: float, hint: str):
    """(normed(x + residual), x + residual) with one SkipSimplifiedLayerNormalization."""
    out, _, _, total = g.op("SkipSimplifiedLayerNormalization", [x, residual, weight], hint,
                            outputs=[f"{g.scope}/{hint}/output_0", "", "", f"{g.scope}/{hint}/output_3"],
                            domain=MS_DOMAIN, epsilon=float(eps))
    return out, total


def _paged_attention(g: GraphBuilder, spec: DecoderSpec, layer: int, x: str, qkv_w: str,
                     qkv_b: str | None, o_w: str, cos: str, sin: str) -> str:
    nH, kvh, D = spec.num_heads, spec.num_kv_heads, spec.head_dim
    qkv = g.op("MatMul", [x, qkv_w], "qkv_proj/MatMul")
    if qkv_b:
        qkv = g.op("Add", [qkv, qkv_b], "qkv_proj/Add")
    q, k, v = g.op("Split", [qkv, g.const([nH * D, kvh * D, kvh * D])], "qkv/Split", n_out=3, axis=1)
    inputs = [q, k, v, cpu.PAST_KEY % layer, cpu.PAST_VALUE % layer, cpu.CU_SEQLENS, cpu.PAST_SEQLENS,
              cpu.BLOCK_TABLE, cos, sin,
              "", "", "", "", "", "",            # slot_mapping, head_sink, q/k norm, k/v scale
              cpu.ATTENTION_METADATA]
    attrs = dict(num_heads=nH, kv_num_heads=kvh, scale=float(1.0 / np.sqrt(D)), do_rotary=1,
                 rotary_interleaved=0, local_window_size=int(spec.sliding_window or -1), softcap=0.0)
    out = g.op("PagedAttention", inputs, "PagedAttention",
               outputs=[f"{g.scope}/PagedAttention/output_0", cpu.PRESENT_KEY % layer,
                        cpu.PRESENT_VALUE % layer], domain=MS_DOMAIN, **attrs)[0]
    return g.op("MatMul", [out, o_w], "o_proj/MatMul")


def _mlp(g: GraphBuilder, spec: DecoderSpec, x: str, gate_up_w: str, down_w: str) -> str:
    I = spec.intermediate_size
    gate, up = g.op("Split", [g.op("MatMul", [x, gate_up_w], "gate_up_proj/MatMul"), g.const([I, I])],
                    "gate_up/Split", n_out=2, axis=1)
    act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])], "silu"), up], "swiglu")
    return g.op("MatMul", [act, down_w], "down_proj/MatMul")


def build_cuda_graph(spec: DecoderSpec, weights, *, block_size: int = 256, context_length: int | None = None,
                     per_token_logits: bool = False, logits_indices: bool = False) -> onnx.ModelProto:
    """The fp16 PagedAttention decoder as an in-memory ModelProto (opset 17 + com.microsoft 1)."""
    refuse_features(spec, "the CUDA graph")
    if spec.hybrid():
        raise NotImplementedError("hybrid decoders (conv / recurrent layer_types) are built for the cpu target only")
    spec.check()
    if spec.ring_layers():
        raise NotImplementedError("sliding-window ring layers (sliding_window_layers) are built for the cpu "
                                  "target only; the cuda graph windows every layer or none")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"PagedAttention needs a power-of-two block_size >= 16, got {block_size}")
    context_length = int(context_length or spec.context_length)
    f16 = np.float16
    g = GraphBuilder()
    cpu.declare_io(g, spec, block_size, TensorProto.FLOAT16, TensorProto.FLOAT, per_token_logits,
                   logits_indices)

    embed = g.initializer("model.embed_tokens.weight", _w(weights, "model.embed_tokens.weight").astype(f16))
    head = embed if spec.tie_word_embeddings else g.initializer(
        "lm_head.weight", _w(weights, "lm_head.weight").astype(f16))
    cos_table, sin_table = rope_tables(spec, context_length, np.float16)
    cos = g.initializer("cos_cache", cos_table)
    sin = g.initializer("sin_cache", sin_table)

    x = g.op("Gather", [embed, cpu.INPUT_IDS], "embed_tokens/Gather", axis=0)      # [N, H] fp16
    residual = None
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        qkv_w, qkv_b, o_w, gate_up_w, down_w = fused_layer_weights(spec, weights, i, dtype=f16,
                                                                   scale_query=False)
        g.scope = f"layers.{i}/attn"
        ln1 = g.initializer(p + "input_layernorm.weight", _w(weights, p + "input_layernorm.weight").astype(f16))
        if residual is None:
            residual = x
            h = _rms_norm_fp32(g, x, ln1, spec.rms_norm_eps, "input_layernorm")
        else:
            h, residual = _skip_rms_norm(g, x, residual, ln1, spec.rms_norm_eps, "input_layernorm")
        x = _paged_attention(
            g, spec, i, h,
            g.initializer(p + "self_attn.qkv_proj.weight", np.ascontiguousarray(qkv_w.T)),
            g.initializer(p + "self_attn.qkv_proj.bias", qkv_b) if qkv_b is not None else None,
            g.initializer(p + "self_attn.o_proj.weight", np.ascontiguousarray(o_w.T)), cos, sin)
        g.scope = f"layers.{i}/mlp"
        ln2 = g.initializer(p + "post_attention_layernorm.weight",
                            _w(weights, p + "post_attention_layernorm.weight").astype(f16))
        h, residual = _skip_rms_norm(g, x, residual, ln2, spec.rms_norm_eps, "post_attention_layernorm")
        x = _mlp(g, spec, h, g.initializer(p + "mlp.gate_up_proj.weight", np.ascontiguousarray(gate_up_w.T)),
                 g.initializer(p + "mlp.down_proj.weight", np.ascontiguousarray(down_w.T)))

    g.scope = "lm_head"
    if logits_indices:
        rows = cpu.LOGITS_INDICES
    elif not per_token_logits:
        rows = g.op("Sub", [g.op("Slice", [cpu.CU_SEQLENS, g.const([1]), g.const([2**62])]),
                            g.const(1, np.int32)], "last_tokens")
    else:
        rows = None
    if rows is not None:
        x = g.op("Gather", [x, rows], "select_rows", axis=0)
        residual = g.op("Gather", [residual, rows], "select_residual", axis=0)
    norm = g.initializer("model.norm.weight", _w(weights, "model.norm.weight").astype(f16))
    h, _ = _skip_rms_norm(g, x, residual, norm, spec.rms_norm_eps, "norm")
    logits16 = g.op("Gemm", [h, head], "MatMul", transB=1)
    g.op("Cast", [logits16], "Cast", outputs=[cpu.LOGITS], to=TensorProto.FLOAT)
    return g.model("oga_paged_decoder_cuda", [("", cpu.OPSET), (MS_DOMAIN, 1)],
                   doc=f"oga.models CUDA paged decoder ({spec.architecture}, block_size {block_size}, fp16)")
