"""CPU decoder graph: a Llama-family decoder with a paged KV cache in standard ONNX ops (fp32).

The graph follows OGA's paged input/output contract (seed "One dynamic step in detail", step 8), so
the same model directory runs under oga and under onnxruntime_genai 0.18's Engine:

    input_ids                    int64 [num_tokens]          packed tokens of every row
    cumulative_sequence_lengths  int32 [batch_size + 1]      row r owns tokens cu[r] .. cu[r+1]-1
    past_sequence_lengths        int32 [batch_size]          tokens already in the cache per row
    block_table                  int32 [batch_size, max_blocks]
    attention_metadata           int32 [3]                   declared for the contract, not read:
                                                             every bound is derived from the above
    logits_indices               int32 [num_logits]          (optional) packed rows to emit
    past_key_values.%d.key/value float32 [num_blocks, block_size, kv_heads, head_dim]

    logits                       float32 [batch_size, vocab] last token of each row
                                 or [num_logits, vocab] (logits_indices) / [num_tokens, vocab]
    present.%d.key/value         the caches, each the direct output of a ScatterND whose data
                                 input is the matching graph input: bind past and present to one
                                 buffer and ONNX Runtime updates it in place (no copy per step)

Token t of row r sits at position p = past[r] + (t - cu[r]); its key/value go to block
block_table[r][p // block_size], slot p % block_size, and it attends to positions 0..p of its own
row (and to the last `sliding_window` of them when the spec windows every layer: Mistral).

Sliding-window ring layers (spec.sliding_window_layers, a proper subset of the layers): those
layers attend to positions p - W < k <= p only and keep their K/V in a ring instead of the full
cache (onnxruntime-genai's windowed paged layers, seed "Sliding-window paged layers"):

    block_table_windowed         int32 [batch_size, max_blocks]  entry j = the row's ring block
                                                                 j mod R (same columns as block_table)
    past_key_values.%d.key/value float32 [window_blocks, block_size, kv_heads, head_dim]
                                 for the ring layers (present.%d.* alias them the same way)

A ring layer addresses its cache exactly like a full layer, through block_table_windowed instead
of block_table: position p lives in block block_table_windowed[r][p // block_size], slot
p % block_size, i.e. ring slot p mod (R * block_size). The engine sizes R so that
R * block_size >= chunk_size + W - 1, so a step's own writes (at most chunk_size per row) never
overwrite a position still inside the window of the step's queries. A ring layer's attention
gathers only the blocks that can hold the window of the row's queries (from block
(past - W + 1) // block_size to the row's last block), so its cost does not grow with the
context. Nothing is zeroed in a ring (the slots after a row's last position may still hold live
positions of an earlier lap); instead the gathered ring keys and values are read as 0 where they
are not finite (memory the engine never zeroed), and every slot outside the window is masked.

Attention runs per row group, never per token: the index tensors of a step are computed once
(`_step_indices`) and shared by every layer. Rows with one query token (decodes) form one group,
rows with several (prefill chunks) another; either may be empty (zero-row shapes are built with
allowzero Reshapes). A group gathers each row's blocks from the cache once ([rows, L, ...], L = the
group's longest context rounded up to whole blocks), so a mixed step costs
decodes x 1 x L_decode + prefills x Q x L_prefill score entries, never rows x max_query x max_kv.
- decode group: keys/values stay in the cache layout [G, L, kv_heads*D]; the queries form a
  block-diagonal matrix so one MatMul per side covers every head without transposing the context.
- prefill group: queries padded to the longest chunk [G, kv_heads, Q*group, D], keys/values
  transposed to head-major, one batched masked MatMul/Softmax/MatMul.

Every slot a row can read is finite: each step's ScatterND also zeroes the unwritten rest of each
row's last block, and block-table columns past a row's own blocks (-1, or blocks reserved ahead)
are redirected to the row's first block before the gather. onnxruntime-genai 0.18 does not zero
its caches, and a masked (zero-probability) NaN still poisons P @ V.

Per layer: RMSNorm (Pow/ReduceMean/Add/Sqrt/Div/Mul, fused by ORT), one Gemm for Q|K|V (+bias),
RoPE (Split/Mul/Sub/Add/Concat), two ScatterND (the present caches), the two group attentions,
a Gather back to packed order, Gemm o_proj, residual Add, RMSNorm, one Gemm for gate|up, SiLU,
Gemm down_proj, residual Add. Linear layers use Gemm(transB=1) on the HF-layout weights, so a tied
LM head shares the embedding initializer; the query rows are pre-scaled by 1/sqrt(head_dim).

Hybrid decoders (spec.layer_types): only the attention layers have paged caches. The other layers
keep one fixed-size state per request, read from a graph input and written to a graph output of
the same shape, row r of both being packed row r (the rows of cumulative_sequence_lengths):

    past_key_values.%d.conv_state       float32 [batch_size, hidden, conv_kernel - 1]   conv layers
    past_key_values.%d.recurrent_state  float32 [batch_size, heads, head_dim, head_dim] recurrent layers
    present.%d.conv_state / present.%d.recurrent_state   the state after the row's last packed token

- conv layer: RMSNorm -> in_proj -> causal depthwise convolution of kernel K over the row's
  previous K-1 inputs (the state, oldest first) followed by its packed tokens -> out_proj ->
  residual; the new state is the last K-1 inputs of that sequence. One Gather of
  concat(state rows, packed inputs) per tap set, no loop.
- recurrent layer: RMSNorm -> q/k/v (q pre-scaled by 1/sqrt(head_dim)) -> per head
  S_t = a S_{t-1} + k_t^T v_t, o_t = q_t S_t -> o_proj -> residual, with a = sigmoid(decay). In
  closed form over a row's chunk of L tokens starting from S_0: o_t = a^(t+1) q_t S_0 +
  sum_{s<=t} a^(t-s) (q_t . k_s) v_s (a decayed causal mask over the packed tokens of the same row)
  and S_L = a^L S_0 + sum_s a^(L-1-s) k_s^T v_s (a [rows, tokens] membership MatMul).

Per-token state capture (`state_capture`, hybrid decoders built with per_token_logits; on by
default there): to verify draft tokens the engine packs them into one row and, when only a prefix
is accepted, commits the state after the last accepted token instead of `present`. So beside every
fixed state output X the graph also writes

    X.per_token                  [num_tokens, *row shape]    e.g. present.0.conv_state.per_token
                                 row i = the state of token i's row after token i: what X would
                                 hold had the row's chunk ended at token i

(same dtype as X; the last token of a row equals that row of X). Both are closed forms, no loop:
- conv: the state after token t is the K-1 inputs ending at t, the last K-1 of t's own taps.
- recurrent: S_t = a^(offset+1) S_0 + sum_{s<=t, same row} a^(t-s) k_s^T v_s: the decayed causal
  mask [heads, N, N] times the per-token outer products k_s^T v_s [heads, N, D*D].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .spec import DecoderSpec

OPSET = 17
IR_VERSION = 8
NEG_INF = -1e30        # masked score: finite, so fully masked (padding) query rows stay NaN-free
FINITE_LIMIT = 1e30    # ring reads: |x| below this is kept, anything else (NaN, inf) reads as 0

INPUT_IDS = "input_ids"
CU_SEQLENS = "cumulative_sequence_lengths"
PAST_SEQLENS = "past_sequence_lengths"
BLOCK_TABLE = "block_table"
BLOCK_TABLE_WINDOWED = "block_table_windowed"
ATTENTION_METADATA = "attention_metadata"
LOGITS_INDICES = "logits_indices"
LOGITS = "logits"
PAST_KEY = "past_key_values.%d.key"
PAST_VALUE = "past_key_values.%d.value"
PRESENT_KEY = "present.%d.key"
PRESENT_VALUE = "present.%d.value"
PAST_CONV = "past_key_values.%d.conv_state"            # OGA 0.18's default templates
PAST_RECURRENT = "past_key_values.%d.recurrent_state"
PRESENT_CONV = "present.%d.conv_state"
PRESENT_RECURRENT = "present.%d.recurrent_state"
PER_TOKEN_SUFFIX = ".per_token"        # fixed state output X -> X + suffix: the state after every packed token


def capture_name(present: str) -> str:
    """The per-token capture output of the fixed state output `present` (see the module docstring)."""
    return present + PER_TOKEN_SUFFIX


# --------------------------------------------------------------------------------------------
# RoPE frequencies and tables (Hugging Face semantics), shared with the CUDA and fused builders

def rope_inv_freq(spec: DecoderSpec, *, local: bool = False, long: bool = False) -> np.ndarray:
    """float64 [rotary_dim / 2] inverse frequencies with the spec's rope_scaling applied; `local`:
    the windowed layers' own base (local_rope_theta), unscaled; `long`: LongRoPE's long factors (else
    its short ones)."""
    d = spec.rotary_dims()
    theta = spec.local_rope_theta if local else spec.rope_theta
    inv = 1.0 / (float(theta) ** (np.arange(0, d, 2, dtype=np.float64) / d))
    scaling = {} if local else spec.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "longrope":
        return inv / np.asarray(scaling["long_factor" if long else "short_factor"], dtype=np.float64)
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2.0 * np.pi / inv
        low_wavelen, high_wavelen = old_len / low, old_len / high
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, scaled)
    raise NotImplementedError(f"rope_scaling type {kind!r} is not supported by the graph builders "
                              "(supported: default, linear, llama3, longrope)")


def rope_tables(spec: DecoderSpec, length: int, dtype, *, local: bool = False,
                long: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [length, rotary_dim / 2] of `dtype` (HF RoPE with the spec's rope_scaling, as
    GroupQueryAttention-style operators take them: non-interleaved halves); `local` and `long` as in
    rope_inv_freq. LongRoPE's tables are scaled by its magnitude (phi3.long_rope_magnitudes)."""
    angles = np.arange(length, dtype=np.float64)[:, None] * rope_inv_freq(spec, local=local, long=long)[None, :]
    magnitude = 1.0
    if spec.long_rope() and not local:
        from .architectures.phi3 import long_rope_magnitudes
        magnitude = long_rope_magnitudes(spec.rope_scaling, spec.context_length)[1 if long else 0]
    return (np.cos(angles) * magnitude).astype(dtype), (np.sin(angles) * magnitude).astype(dtype)


# --------------------------------------------------------------------------------------------
# A small graph-building helper

class GraphBuilder:
    """Collects nodes and initializers; `op` returns the output name(s) of the node it adds."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}
        self.scope = ""

    def _unique(self, hint: str, scoped: bool = True) -> str:
        base = f"{self.scope}/{hint}" if self.scope and scoped else hint
        name, n = base, 0
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._names.add(name)
        return name

    def input(self, name, elem_type, shape):
        self._names.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name, elem_type, shape):
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def initializer(self, name: str, array: np.ndarray) -> str:
        self._names.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, value, dtype=np.int64) -> str:
        """A small constant initializer, deduplicated by value."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            text = "_".join(str(v) for v in arr.reshape(-1)[:6]) if arr.size else "empty"
            self._consts[key] = self.initializer(self._unique(f"const/{arr.dtype.name}/{text}", scoped=False), arr)
        return self._consts[key]

    def op(self, op_type, inputs, hint=None, outputs=None, n_out=1, domain=None, **attrs):
        node_name = self._unique(hint or op_type)
        if outputs is None:
            outputs = [node_name if n_out == 1 else f"{node_name}:{i}" for i in range(n_out)]
            self._names.update(outputs)
        kw = {"domain": domain} if domain else {}
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=node_name,
                                           **kw, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def model(self, graph_name, opsets, doc=""):
        graph = helper.make_graph(self.nodes, graph_name, self.inputs, self.outputs,
                                  initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                        for d, v in opsets],
                                  producer_name="oga.models", doc_string=doc)
        model.ir_version = IR_VERSION
        return model

    # shorthands for index arithmetic
    def i64(self, x):
        return self.op("Cast", [x], "Cast", to=TensorProto.INT64)

    def unsq(self, x, axes):
        return self.op("Unsqueeze", [x, self.const(axes)], "Unsqueeze")

    def shape_of(self, *parts):
        """A 1-D int64 shape tensor from [1]-tensors and ints (for Reshape with allowzero=1)."""
        names = [p if isinstance(p, str) else self.const([p]) for p in parts]
        return names[0] if len(names) == 1 else self.op("Concat", names, "shape", axis=0)

    def reshape(self, x, shape):
        return self.op("Reshape", [x, shape], "Reshape", allowzero=1)


# --------------------------------------------------------------------------------------------
# Weights

def _w(weights, name):
    try:
        return np.asarray(weights[name], dtype=np.float32)
    except KeyError:
        raise ValueError(f"weight {name!r} is missing") from None


def fused_layer_weights(spec: DecoderSpec, weights, layer: int, dtype=np.float32, scale_query=True):
    """HF-layout fused projections of one layer; with `scale_query` the query rows are pre-scaled
    by the scores' scale (spec.scale(): RoPE is a rotation and an RMSNorm of the query would undo it,
    so with q/k norms the scale is applied after them instead, by the caller).

    Returns (qkv_w [q+2kv, H], qkv_b [q+2kv] or None, o_w [H, q], gate_up_w [2I, H], down_w [H, I]).
    """
    p = f"model.layers.{layer}."
    scale = np.float32(spec.scale()) if scale_query else np.float32(1.0)
    qkv_w = np.concatenate([_w(weights, p + "self_attn.q_proj.weight") * scale,
                            _w(weights, p + "self_attn.k_proj.weight"),
                            _w(weights, p + "self_attn.v_proj.weight")], axis=0)
    qkv_b = None
    if spec.qkv_bias:
        qkv_b = np.concatenate([_w(weights, p + "self_attn.q_proj.bias") * scale,
                                _w(weights, p + "self_attn.k_proj.bias"),
                                _w(weights, p + "self_attn.v_proj.bias")], axis=0)
    gate_up_w = np.concatenate([_w(weights, p + "mlp.gate_proj.weight"),
                                _w(weights, p + "mlp.up_proj.weight")], axis=0)
    cast = (lambda a: None if a is None else a.astype(dtype))
    return (cast(qkv_w), cast(qkv_b), cast(_w(weights, p + "self_attn.o_proj.weight")),
            cast(gate_up_w), cast(_w(weights, p + "mlp.down_proj.weight")))


# --------------------------------------------------------------------------------------------
# Per-step index tensors, computed once and shared by all layers

@dataclass
class RowGroup:
    """One attention group of rows (all decode rows, or all multi-token rows)."""
    decode: bool
    token_index: str    # int64 [G] (decode) or [G, Q] (prefill): packed query token of each slot
    block_cols: str     # int32 [G, nb]: the rows' blocks, cut to the group's longest context;
                        # columns past a row's own blocks repeat its first block (finite data)
    kv_shape: str       # decode [G, L, kv_heads*D]; prefill [G, L, kv_heads, D]; L = nb * block_size
    mask: str           # float additive mask: decode [G, 1, L]; prefill [G, 1, Q*group, L]
    q_shape: str = ""   # prefill: [G, kv_heads, Q*group, D]
    out5_shape: str = ""  # prefill: [G, kv_heads, Q, group, D]
    out_shape: str = ""   # prefill: [G*Q, num_heads*D]
    sanitize: bool = False  # ring group: gathered keys/values read as 0 where not finite


@dataclass
class RingIndices:
    """The sliding-window ring layers' tensors: same row groups, through block_table_windowed."""
    scatter_index: str  # int64 [N, 2]: (ring block, slot) of each packed token
    groups: list        # [decode RowGroup, prefill RowGroup] (window masks, ring block columns)


@dataclass
class StepIndices:
    scatter_index: str  # int64 [N + M, 2]: (block, slot) of each packed token, then of M tail slots
    tail_zeros: str     # float [M, kv_heads, D]: zeros written to the tail slots
    cos: str            # float [N, 1, R/2] (R: the rotary dims; LongRoPE: each token's row's table)
    sin: str
    local_cos: str      # the windowed layers' own tables (local_rope_theta), else cos / sin
    local_sin: str
    groups: list        # [decode RowGroup, prefill RowGroup]
    back_index: str     # int64 [N]: row of concat(group outputs) holding token t
    ring: RingIndices | None = None


def _step_indices(g: GraphBuilder, spec: DecoderSpec, block_size: int) -> StepIndices:
    g.scope = "step"
    bs, kvh, D = block_size, spec.num_kv_heads, spec.head_dim
    ring = bool(spec.ring_layers())
    # a window on every layer (Mistral) is a mask over the full cache; ring layers have their own
    full_window = spec.sliding_window if spec.sliding_window_layers is None else None
    grp = spec.num_heads // kvh
    cu = g.i64(CU_SEQLENS)
    past = g.i64(PAST_SEQLENS)
    starts = g.op("Slice", [cu, g.const([0]), g.const([-1])], "starts")
    ends = g.op("Slice", [cu, g.const([1]), g.const([2**62])], "ends")
    qlen = g.op("Sub", [ends, starts], "query_lengths")
    kvlen = g.op("Add", [past, qlen], "kv_lengths")
    row_blocks = g.op("Div", [g.op("Add", [kvlen, g.const(bs - 1)]), g.const(bs)], "row_blocks")
    n = g.op("Shape", [INPUT_IDS], "num_tokens")                                   # [1]
    t = g.op("Range", [g.const(0), g.op("Squeeze", [n, g.const([0])]), g.const(1)], "tokens")

    # row of each packed token = number of rows that end at or before it
    done = g.op("LessOrEqual", [g.unsq(ends, [0]), g.unsq(t, [1])], "rows_done")  # [N, B]
    row = g.op("ReduceSum", [g.i64(done), g.const([1])], "token_row", keepdims=0)
    offset = g.op("Sub", [t, g.op("Gather", [starts, row])], "token_offset")
    pos = g.op("Add", [g.op("Gather", [past, row]), offset], "position")

    # cache slot of each token: block_table[row][pos // bs], pos % bs
    def table_width(table, hint):
        return g.op("Slice", [g.op("Shape", [table]), g.const([1]), g.const([2])], hint)

    max_blocks = table_width(BLOCK_TABLE, "max_blocks")
    flat_table = g.reshape(BLOCK_TABLE, g.const([-1]))

    def slots(rows_of, positions, hint, table=flat_table, width=max_blocks):
        column = g.op("Min", [g.op("Div", [positions, g.const(bs)]), g.op("Sub", [width, g.const([1])])])
        block = g.i64(g.op("Gather", [table, g.op("Add", [g.op("Mul", [rows_of, width]), column])]))
        slot = g.op("Mod", [positions, g.const(bs)])
        return g.op("Concat", [g.unsq(block, [-1]), g.unsq(slot, [-1])], hint, axis=-1)

    token_slots = slots(row, pos, "token_slots")                                    # [N, 2]
    if ring:
        # the same slots through the ring table; no tail zeroing there (see the module docstring)
        ring_width = table_width(BLOCK_TABLE_WINDOWED, "ring/max_blocks")
        ring_slots = slots(row, pos, "ring/token_slots", g.reshape(BLOCK_TABLE_WINDOWED, g.const([-1])),
                           ring_width)                                               # [N, 2]
    # Tail slots: the unwritten rest of each row's last block. Attention reads whole blocks, and
    # those slots hold whatever the cache held before (onnxruntime-genai does not zero its caches:
    # never-written memory can hold NaN bit patterns, and a zero probability times NaN is NaN).
    # Zeroing them in the same ScatterND keeps every slot a row can read finite.
    if bs > 1:
        j = g.const(np.arange(bs - 1)[None, :])                                      # [1, bs-1]
        tail_pos = g.op("Add", [g.unsq(kvlen, [1]), j], "tail_positions")             # [B, bs-1]
        tail_ok = g.op("Less", [tail_pos, g.unsq(g.op("Mul", [row_blocks, g.const(bs)]), [1])])
        b_count = g.op("Shape", [kvlen])
        row_ids = g.unsq(g.op("Range", [g.const(0), g.op("Squeeze", [b_count, g.const([0])]), g.const(1)]), [1])
        tail = slots(g.op("Expand", [row_ids, g.op("Shape", [tail_pos])]), tail_pos, "tail_slots")
        tail = g.op("Compress", [g.reshape(tail, g.const([-1, 2])), g.reshape(tail_ok, g.const([-1]))],
                    "tail_slots/valid", axis=0)                                          # [M, 2]
        scatter = g.op("Concat", [token_slots, tail], "scatter_index", axis=0)
        m = g.op("Slice", [g.op("Shape", [tail]), g.const([0]), g.const([1])])
        tail_zeros = g.op("Expand", [g.const(np.zeros((1, 1, 1)), np.float32), g.shape_of(m, kvh, D)],
                          "tail_zeros")                                                # [M, kvh, D]
    else:
        scatter, tail_zeros = token_slots, None

    # RoPE tables for every token
    position = g.unsq(g.op("Cast", [pos], to=TensorProto.FLOAT), [1])                 # [N, 1]

    def rope(inv_freq, magnitude, hint):
        angles = g.op("Mul", [position, g.const(inv_freq[None, :], np.float32)], f"{hint}/angles")   # [N, R/2]
        cos, sin = g.op("Cos", [angles], f"{hint}/cos"), g.op("Sin", [angles], f"{hint}/sin")
        if magnitude != 1.0:
            cos = g.op("Mul", [cos, g.const(np.float32(magnitude), np.float32)], f"{hint}/cos/magnitude")
            sin = g.op("Mul", [sin, g.const(np.float32(magnitude), np.float32)], f"{hint}/sin/magnitude")
        return cos, sin

    if spec.long_rope():
        # LongRoPE per row: a token rotates with the long tables when its row is longer than the
        # original context after this step (kv_lengths), as oga.PagedGroupQueryAttention chooses
        from .architectures.phi3 import long_rope_magnitudes
        short_magnitude, long_magnitude = long_rope_magnitudes(spec.rope_scaling, spec.context_length)
        short = rope(rope_inv_freq(spec), short_magnitude, "rope_short")
        long = rope(rope_inv_freq(spec, long=True), long_magnitude, "rope_long")
        switch = int(spec.rope_scaling["original_max_position_embeddings"])
        uses_long = g.unsq(g.op("Greater", [g.op("Gather", [kvlen, row]), g.const(switch)], "long_rows"), [1])
        cos, sin = (g.op("Where", [uses_long, lv, sv], f"rope/{n}") for n, sv, lv in zip(("cos", "sin"), short, long))
    else:
        cos, sin = rope(rope_inv_freq(spec), 1.0, "rope")
    cos, sin = g.unsq(cos, [1]), g.unsq(sin, [1])                                    # [N, 1, R/2]
    local_cos, local_sin = cos, sin
    if spec.local_rope_theta:
        local_cos, local_sin = (g.unsq(t, [1]) for t in rope(rope_inv_freq(spec, local=True), 1.0, "rope_local"))

    # row groups: decode rows (one query token) and the rest
    is_decode = g.op("Equal", [qlen, g.const(1)], "is_decode")
    not_decode = g.op("Not", [is_decode], "is_prefill")
    groups, ring_groups = [], []
    for decode, selector in ((True, is_decode), (False, not_decode)):
        g.scope = "step/decode" if decode else "step/prefill"
        rows = g.op("Squeeze", [g.op("NonZero", [selector]), g.const([0])], "rows")  # [G]
        count = g.op("Shape", [rows], "count")                                       # [1]
        q = g.const([1]) if decode else g.op("ReduceMax", [qlen], "max_query", keepdims=1)
        row_start = g.op("Gather", [starts, rows])
        row_past = g.op("Gather", [past, rows])
        if decode:
            token_index = row_start                                                  # [G]
            qpos = g.unsq(row_past, [1])                                             # [G, 1]
        else:
            i = g.op("Range", [g.const(0), g.op("Squeeze", [q, g.const([0])]), g.const(1)], "query_slots")
            last = g.op("Sub", [n, g.const([1])])
            token_index = g.op("Min", [g.op("Add", [g.unsq(row_start, [1]), g.unsq(i, [0])]), last],
                               "token_index")                                        # [G, Q]
            qpos = g.op("Add", [g.unsq(row_past, [1]), g.unsq(i, [0])], "query_positions")
        qpos3 = g.unsq(qpos, [2])                                                    # [G, Q, 1]
        if not decode:
            prefill_shapes = dict(
                q_shape=g.shape_of(count, kvh, g.op("Mul", [q, g.const([grp])]), D),
                out5_shape=g.shape_of(count, kvh, q, grp, D),
                out_shape=g.shape_of(g.op("Mul", [count, q]), spec.num_heads * D))

        def make_group(cols, length, kpos, window, sanitize):
            """The RowGroup over gathered key positions `kpos` ([1, 1, L] or [G, 1, L])."""
            allowed = g.op("LessOrEqual", [kpos, qpos3], "causal")
            if window:
                lower = g.op("Sub", [qpos3, g.const(int(window))])
                allowed = g.op("And", [allowed, g.op("Greater", [kpos, lower])], "windowed")
            bias = g.op("Where", [allowed, g.const(0.0, np.float32), g.const(NEG_INF, np.float32)],
                        "mask")                                                      # [G, Q, L]
            if decode:
                return RowGroup(decode=True, token_index=token_index, block_cols=cols,
                                kv_shape=g.shape_of(count, length, kvh * D), mask=bias, sanitize=sanitize)
            bias = g.unsq(bias, [1, 3])                                              # [G,1,Q,1,L]
            if grp > 1:
                bias = g.op("Expand", [bias, g.shape_of(count, 1, q, grp, length)])
            mask = g.reshape(bias, g.shape_of(count, 1, g.op("Mul", [q, g.const([grp])]), length))
            return RowGroup(decode=False, token_index=token_index, block_cols=cols,
                            kv_shape=g.shape_of(count, length, kvh, D), mask=mask, sanitize=sanitize,
                            **prefill_shapes)

        # the group's longest context in whole blocks ([0] guards an empty group); a row's
        # columns past its own blocks (-1 or blocks reserved ahead) read its first block instead
        group_blocks = g.op("Gather", [row_blocks, rows])
        nb = g.op("Min", [g.op("ReduceMax", [g.op("Concat", [g.const([0]), group_blocks], axis=0)],
                               keepdims=1), max_blocks], "num_block_cols")
        cols = g.op("Slice", [g.op("Gather", [BLOCK_TABLE, rows], axis=0), g.const([0]), nb,
                              g.const([1])], "block_cols")
        c = g.op("Range", [g.const(0), g.op("Squeeze", [nb, g.const([0])]), g.const(1)], "columns")
        own = g.op("Less", [g.unsq(c, [0]), g.unsq(group_blocks, [1])], "own_columns")
        first = g.op("Slice", [cols, g.const([0]), g.const([1]), g.const([1])], "first_block")
        cols = g.op("Where", [own, cols, first], "clean_block_cols")
        length = g.op("Mul", [nb, g.const([bs])], "kv_span")
        k = g.op("Range", [g.const(0), g.op("Squeeze", [length, g.const([0])]), g.const(1)], "key_positions")
        groups.append(make_group(cols, length, g.unsq(k, [0, 1]), full_window, False))   # kpos [1, 1, L]

        if ring:
            # ring layers: only the blocks that can hold the window of the row's queries, from
            # block (past - W + 1) // bs to the row's last block; columns past the row's own
            # blocks read its first window block (masked)
            g.scope += "/ring"
            window = int(spec.sliding_window)
            first_col = g.op("Div", [g.op("Max", [g.op("Sub", [row_past, g.const(window - 1)]), g.const(0)]),
                                     g.const(bs)], "first_column")                    # [G]
            span = g.op("Sub", [group_blocks, first_col], "row_span")
            rnb = g.op("Min", [g.op("ReduceMax", [g.op("Concat", [g.const([0]), span], axis=0)], keepdims=1),
                               ring_width], "num_block_cols")
            rc = g.op("Range", [g.const(0), g.op("Squeeze", [rnb, g.const([0])]), g.const(1)], "columns")
            first2 = g.unsq(first_col, [1])                                          # [G, 1]
            col = g.op("Add", [first2, g.unsq(rc, [0])], "column_ids")                # [G, nbw]
            col = g.op("Where", [g.op("Less", [col, g.unsq(group_blocks, [1])]), col, first2], "own_columns")
            col = g.op("Min", [col, g.op("Sub", [ring_width, g.const([1])])], "clamped_columns")
            rcols = g.op("GatherElements", [g.op("Gather", [BLOCK_TABLE_WINDOWED, rows], axis=0), col],
                         "block_cols", axis=1)                                        # [G, nbw]
            rlength = g.op("Mul", [rnb, g.const([bs])], "kv_span")
            rk = g.op("Range", [g.const(0), g.op("Squeeze", [rlength, g.const([0])]), g.const(1)])
            kpos = g.op("Add", [g.op("Mul", [first2, g.const(bs)]), g.unsq(rk, [0])], "key_positions")
            ring_groups.append(make_group(rcols, rlength, g.unsq(kpos, [1]), window, True))  # [G, 1, Lw]

        if decode:
            decode_count = count
        else:
            prefill_q = q

    # where each token's attention output lands in concat(decode outputs, prefill outputs)
    g.scope = "step"
    rank_d = g.op("Sub", [g.op("CumSum", [g.i64(is_decode), g.const(0)]), g.const(1)], "decode_rank")
    rank_p = g.op("Sub", [g.op("CumSum", [g.i64(not_decode), g.const(0)]), g.const(1)], "prefill_rank")
    prefill_slot = g.op("Add", [g.op("Add", [decode_count, g.op("Mul", [g.op("Gather", [rank_p, row]),
                                                                         prefill_q])]), offset])
    back = g.op("Where", [g.op("Gather", [is_decode, row]), g.op("Gather", [rank_d, row]), prefill_slot],
                "back_index")
    g.scope = ""
    return StepIndices(scatter_index=scatter, tail_zeros=tail_zeros, cos=cos, sin=sin, local_cos=local_cos,
                       local_sin=local_sin, groups=groups, back_index=back,
                       ring=RingIndices(scatter_index=ring_slots, groups=ring_groups) if ring else None)


# --------------------------------------------------------------------------------------------
# Blocks

def _embeddings(g: GraphBuilder, embed_name: str) -> str:
    return g.op("Gather", [embed_name, INPUT_IDS], "embed_tokens/Gather", axis=0)


def _rms_norm(g: GraphBuilder, x: str, weight: str, eps: float, hint: str) -> str:
    # Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul: the pattern ONNX Runtime fuses into
    # SimplifiedLayerNormalization.
    ms = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0, np.float32)], f"{hint}/Pow")],
              f"{hint}/ReduceMean", axes=[-1], keepdims=1)
    rms = g.op("Sqrt", [g.op("Add", [ms, g.const(eps, np.float32)], f"{hint}/Add")], f"{hint}/Sqrt")
    return g.op("Mul", [g.op("Div", [x, rms], f"{hint}/Div"), weight], f"{hint}/Mul")


def _rope(g: GraphBuilder, x: str, cos: str, sin: str, rotary: int, head_dim: int) -> str:
    """HF rotate_half RoPE on the first `rotary` dims of x [N, heads, D]: (x1, x2) -> (x1 c - x2 s,
    x2 c + x1 s); the other dims (partial rotary) pass through."""
    half = rotary // 2
    parts = [half, half] + ([head_dim - rotary] if rotary < head_dim else [])
    split = g.op("Split", [x, g.const(parts)], "rope/Split", n_out=len(parts), axis=-1)
    x1, x2 = split[0], split[1]
    out1 = g.op("Sub", [g.op("Mul", [x1, cos]), g.op("Mul", [x2, sin])], "rope/first")
    out2 = g.op("Add", [g.op("Mul", [x2, cos]), g.op("Mul", [x1, sin])], "rope/second")
    return g.op("Concat", [out1, out2] + split[2:], "rope/Concat", axis=-1)


def _softcap(g: GraphBuilder, x: str, cap: float, hint: str) -> str:
    """cap * tanh(x / cap) (Gemma2's attention and final softcaps); x itself when cap is 0."""
    if not cap:
        return x
    c = g.const(np.float32(cap), np.float32)
    return g.op("Mul", [g.op("Tanh", [g.op("Div", [x, c], f"{hint}/Div")], f"{hint}/Tanh"), c], f"{hint}/Mul")


def _finite(g: GraphBuilder, x: str, hint: str) -> str:
    """x where |x| < FINITE_LIMIT, else 0 (NaN and inf included): ring memory the engine never
    zeroed is read as 0, so a masked slot cannot poison P @ V."""
    ok = g.op("Less", [g.op("Abs", [x], f"{hint}/Abs"), g.const(FINITE_LIMIT, np.float32)], f"{hint}/finite")
    return g.op("Where", [ok, x, g.const(0.0, np.float32)], f"{hint}/Where")


def _gather_kv(g: GraphBuilder, k_cache: str, v_cache: str, grp_idx: RowGroup, hint: str):
    """The group's keys and values, gathered block by block into grp_idx.kv_shape."""
    k = g.reshape(g.op("Gather", [k_cache, grp_idx.block_cols], f"{hint}/k", axis=0), grp_idx.kv_shape)
    v = g.reshape(g.op("Gather", [v_cache, grp_idx.block_cols], f"{hint}/v", axis=0), grp_idx.kv_shape)
    if grp_idx.sanitize:
        k, v = _finite(g, k, f"{hint}/k"), _finite(g, v, f"{hint}/v")
    return k, v


def _decode_attention(g: GraphBuilder, spec: DecoderSpec, q4: str, k_cache: str, v_cache: str,
                      grp_idx: RowGroup) -> str:
    """Attention of the single-token rows; returns [G, num_heads*D].

    Keys and values stay in the cache's own layout ([G, L, kv_heads*D], a free reshape of the
    gathered blocks): no transpose of the context. The query of kv head h is placed in a
    block-diagonal [kv_heads*group, kv_heads*D] matrix, so one MatMul against K^T (ORT fuses the
    last-two-dims Transpose into the MatMul) gives every head's scores; P @ V gives all
    kv_heads x kv_heads head pairings, of which the diagonal is kept. The extra work is a factor
    kv_heads on two tiny operands; the context is read once per MatMul.
    """
    kvh, D = spec.num_kv_heads, spec.head_dim
    grp = spec.num_heads // kvh
    eye = g.const(np.eye(kvh, dtype=np.float32).reshape(kvh, 1, kvh, 1), np.float32)   # [kvh,1,kvh,1]
    q = g.op("Gather", [q4, grp_idx.token_index], "decode/q", axis=0)                   # [G, kvh, grp, D]
    q = g.op("Mul", [g.unsq(q, [3]), eye], "decode/q/block_diagonal")                   # [G,kvh,grp,kvh,D]
    q = g.op("Reshape", [q, g.const([0, kvh * grp, kvh * D])], "decode/q/Reshape")
    k, v = _gather_kv(g, k_cache, v_cache, grp_idx, "decode")
    k = g.op("Transpose", [k], "decode/k/Transpose", perm=[0, 2, 1])                   # [G, kvh*D, L]
    scores = _softcap(g, g.op("MatMul", [q, k], "decode/QK"), spec.attention_softcap, "decode/softcap")
    scores = g.op("Add", [scores, grp_idx.mask], "decode/masked")
    probs = g.op("Softmax", [scores], "decode/Softmax", axis=-1)                        # [G, kvh*grp, L]
    out = g.op("MatMul", [probs, v], "decode/PV")                                       # [G, kvh*grp, kvh*D]
    out = g.op("Reshape", [out, g.const([0, kvh, grp, kvh, D])], "decode/out/Reshape")
    out = g.op("ReduceSum", [g.op("Mul", [out, eye], "decode/out/diagonal"), g.const([3])],
               "decode/out/ReduceSum", keepdims=0)                                      # [G, kvh, grp, D]
    return g.op("Reshape", [out, g.const([0, spec.num_heads * D])], "decode/out")


def _prefill_attention(g: GraphBuilder, spec: DecoderSpec, q4: str, k_cache: str, v_cache: str,
                       grp_idx: RowGroup) -> str:
    """Padded masked attention of the multi-token rows; returns [G*Q, num_heads*D]."""
    q = g.op("Gather", [q4, grp_idx.token_index], "prefill/q", axis=0)                  # [G, Q, kvh, grp, D]
    q = g.reshape(g.op("Transpose", [q], "prefill/q/Transpose", perm=[0, 2, 1, 3, 4]), grp_idx.q_shape)
    k, v = _gather_kv(g, k_cache, v_cache, grp_idx, "prefill")
    k = g.op("Transpose", [k], "prefill/k/Transpose", perm=[0, 2, 3, 1])               # [G, kvh, D, L]
    v = g.op("Transpose", [v], "prefill/v/Transpose", perm=[0, 2, 1, 3])               # [G, kvh, L, D]
    scores = _softcap(g, g.op("MatMul", [q, k], "prefill/QK"), spec.attention_softcap, "prefill/softcap")
    scores = g.op("Add", [scores, grp_idx.mask], "prefill/masked")
    probs = g.op("Softmax", [scores], "prefill/Softmax", axis=-1)
    out = g.op("MatMul", [probs, v], "prefill/PV")                                      # [G, kvh, Q*grp, D]
    out = g.op("Transpose", [g.reshape(out, grp_idx.out5_shape)], "prefill/out/Transpose",
               perm=[0, 2, 1, 3, 4])                                                    # [G, Q, kvh, grp, D]
    return g.reshape(out, grp_idx.out_shape)


def _attention(g: GraphBuilder, spec: DecoderSpec, layer: int, x: str, idx: StepIndices,
               qkv_w: str, qkv_b: str | None, o_w: str, ring: bool = False, qk_norms: tuple | None = None) -> str:
    """One attention block; a `ring` layer writes and reads its ring cache through
    block_table_windowed (idx.ring) with the window mask, the others the full cache. `qk_norms`:
    the q / k norm weights (the query then scaled after its norm, not in qkv_w)."""
    nH, kvh, D = spec.num_heads, spec.num_kv_heads, spec.head_dim
    qkv = g.op("Gemm", [x, qkv_w] + ([qkv_b] if qkv_b else []), "qkv_proj", transB=1)
    q, k, v = g.op("Split", [qkv, g.const([nH * D, kvh * D, kvh * D])], "qkv/Split", n_out=3, axis=1)
    q, k = g.reshape(q, g.const([-1, nH, D])), g.reshape(k, g.const([-1, kvh, D]))
    if qk_norms:
        q = g.op("Mul", [_rms_norm(g, q, qk_norms[0], spec.rms_norm_eps, "q_norm"),
                         g.const(np.float32(spec.scale()), np.float32)], "q_norm/scaled")
        k = _rms_norm(g, k, qk_norms[1], spec.rms_norm_eps, "k_norm")
    cos, sin = (idx.local_cos, idx.local_sin) if spec.windowed(layer) else (idx.cos, idx.sin)
    q = _rope(g, q, cos, sin, spec.rotary_dims(), D)
    k = _rope(g, k, cos, sin, spec.rotary_dims(), D)
    v = g.reshape(v, g.const([-1, kvh, D]))
    if ring:
        scatter_index, (decode, prefill) = idx.ring.scatter_index, idx.ring.groups
    else:
        scatter_index, (decode, prefill) = idx.scatter_index, idx.groups
        if idx.tail_zeros is not None:
            k = g.op("Concat", [k, idx.tail_zeros], "k/with_tail", axis=0)
            v = g.op("Concat", [v, idx.tail_zeros], "v/with_tail", axis=0)
    k_cache = g.op("ScatterND", [PAST_KEY % layer, scatter_index, k], "k_cache/ScatterND",
                   outputs=[PRESENT_KEY % layer])
    v_cache = g.op("ScatterND", [PAST_VALUE % layer, scatter_index, v], "v_cache/ScatterND",
                   outputs=[PRESENT_VALUE % layer])
    q4 = g.reshape(q, g.const([-1, kvh, nH // kvh, D]))                                # [N, kvh, grp, D]
    outs = [_decode_attention(g, spec, q4, k_cache, v_cache, decode),
            _prefill_attention(g, spec, q4, k_cache, v_cache, prefill)]
    attn = g.op("Gather", [g.op("Concat", outs, "groups/Concat", axis=0), idx.back_index],
                "unpack", axis=0)                                                        # [N, nH*D]
    return g.op("Gemm", [attn, o_w], "o_proj", transB=1)


def _mlp(g: GraphBuilder, spec: DecoderSpec, x: str, gate_up_w: str, down_w: str) -> str:
    I = spec.intermediate_size
    gate, up = g.op("Split", [g.op("Gemm", [x, gate_up_w], "gate_up_proj", transB=1),
                              g.const([I, I])], "gate_up/Split", n_out=2, axis=1)
    if spec.activation == "gelu_tanh":   # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = g.op("Mul", [g.op("Pow", [gate, g.const(3.0, np.float32)], "gelu/Pow"),
                            g.const(np.float32(0.044715), np.float32)], "gelu/cube")
        inner = g.op("Mul", [g.op("Add", [gate, cube], "gelu/Add"),
                             g.const(np.float32(np.sqrt(2.0 / np.pi)), np.float32)], "gelu/inner")
        half = g.op("Mul", [gate, g.const(0.5, np.float32)], "gelu/half")
        activated = g.op("Mul", [half, g.op("Add", [g.op("Tanh", [inner], "gelu/Tanh"), g.const(1.0, np.float32)],
                                             "gelu/one_plus")], "gelu")
    else:
        activated = g.op("Mul", [gate, g.op("Sigmoid", [gate], "silu/Sigmoid")], "silu/Mul")
    act = g.op("Mul", [activated, up], "gated")
    return g.op("Gemm", [act, down_w], "down_proj", transB=1)


def _lm_head(g: GraphBuilder, spec: DecoderSpec, x: str, norm_w: str, head_w: str,
             per_token_logits: bool, logits_indices: bool) -> str:
    """Select the rows that need logits, then final norm and LM head (fp32 `logits`)."""
    g.scope = "lm_head"
    if logits_indices:
        x = g.op("Gather", [x, LOGITS_INDICES], "select_rows", axis=0)
    elif not per_token_logits:
        last = g.op("Sub", [g.op("Slice", [CU_SEQLENS, g.const([1]), g.const([2**62])]),
                            g.const(1, np.int32)], "last_tokens")
        x = g.op("Gather", [x, last], "select_rows", axis=0)
    x = _rms_norm(g, x, norm_w, spec.rms_norm_eps, "norm")
    if spec.logits_multiplier == 1.0 and not spec.final_softcap:
        return g.op("Gemm", [x, head_w], "MatMul", outputs=[LOGITS], transB=1)
    logits = g.op("Gemm", [x, head_w], "MatMul", transB=1)
    if spec.logits_multiplier != 1.0:
        logits = g.op("Mul", [logits, g.const(np.float32(spec.logits_multiplier), np.float32)], "logits_multiplier")
    if spec.final_softcap:
        logits = _softcap(g, logits, spec.final_softcap, "final_softcap")
    return g.op("Identity", [logits], "logits", outputs=[LOGITS])


# --------------------------------------------------------------------------------------------
# Fixed-state layers (hybrid decoders)

@dataclass
class FixedIndices:
    """Per-step index tensors of the fixed-state layers, shared by all of them."""
    rows: str          # int64 [1]: batch_size
    starts: str        # int64 [B]: first packed token of each row
    qlen: str          # int64 [B]: tokens of each row in this step
    row: str           # int64 [N]: row of each packed token
    offset: str        # int64 [N]: offset of each token within its row's chunk
    row_ids: str       # int64 [B]: 0 .. B-1
    same_row: str      # bool [N, N]: token s (column) precedes or is token t (row) of the same row
    distance: str      # float [N, N]: t - s (clamped at 0)
    membership: str    # float [B, N]: 1 where token s belongs to row r


def _fixed_indices(g: GraphBuilder) -> FixedIndices:
    g.scope = "fixed_state"
    cu = g.i64(CU_SEQLENS)
    starts = g.op("Slice", [cu, g.const([0]), g.const([-1])], "starts")
    ends = g.op("Slice", [cu, g.const([1]), g.const([2**62])], "ends")
    qlen = g.op("Sub", [ends, starts], "query_lengths")
    n = g.op("Shape", [INPUT_IDS], "num_tokens")
    t = g.op("Range", [g.const(0), g.op("Squeeze", [n, g.const([0])]), g.const(1)], "tokens")
    done = g.op("LessOrEqual", [g.unsq(ends, [0]), g.unsq(t, [1])], "rows_done")      # [N, B]
    row = g.op("ReduceSum", [g.i64(done), g.const([1])], "token_row", keepdims=0)
    offset = g.op("Sub", [t, g.op("Gather", [starts, row])], "token_offset")
    b = g.op("Shape", [qlen], "batch_size")
    row_ids = g.op("Range", [g.const(0), g.op("Squeeze", [b, g.const([0])]), g.const(1)], "row_ids")
    same = g.op("Equal", [g.unsq(row, [1]), g.unsq(row, [0])], "same_row")
    causal = g.op("LessOrEqual", [g.unsq(t, [0]), g.unsq(t, [1])], "causal")          # s <= t
    allowed = g.op("And", [same, causal], "allowed")
    distance = g.op("Cast", [g.op("Max", [g.op("Sub", [g.unsq(t, [1]), g.unsq(t, [0])]), g.const(0)])],
                    "distance", to=TensorProto.FLOAT)
    member = g.op("Cast", [g.op("Equal", [g.unsq(row_ids, [1]), g.unsq(row, [0])])], "membership",
                  to=TensorProto.FLOAT)
    g.scope = ""
    return FixedIndices(rows=b, starts=starts, qlen=qlen, row=row, offset=offset, row_ids=row_ids,
                        same_row=allowed, distance=distance, membership=member)


def _conv_layer(g: GraphBuilder, spec: DecoderSpec, layer: int, h: str, fi: FixedIndices, weights,
                capture: bool = False) -> str:
    """Causal depthwise convolution over [state (K-1 oldest-first inputs), packed inputs] per row;
    with `capture` also the state after every packed token."""
    p = f"model.layers.{layer}.conv."
    K, C = int(spec.conv_kernel), spec.hidden_size
    km = K - 1
    u = g.op("Gemm", [h, g.initializer(p + "in_proj.weight", _w(weights, p + "in_proj.weight"))], "in_proj",
             transB=1)                                                                     # [N, C]
    state = g.op("Transpose", [PAST_CONV % layer], "state/Transpose", perm=[0, 2, 1])   # [B, K-1, C]
    ext = g.op("Concat", [g.reshape(state, g.const([-1, C])), u], "extended", axis=0)   # [B*(K-1)+N, C]
    base = g.op("Mul", [fi.rows, g.const([km])], "state_rows")                           # [1]

    def source(rows, starts, rel):
        """Row of `ext` holding input `rel` (relative to the row's first packed token)."""
        from_tokens = g.op("Add", [g.unsq(g.op("Add", [starts, base]), [1]), rel])
        from_state = g.op("Add", [g.unsq(g.op("Add", [g.op("Mul", [rows, g.const(km)]), g.const(km)]), [1]), rel])
        return g.op("Where", [g.op("GreaterOrEqual", [rel, g.const(0)]), from_tokens, from_state], "source")

    rel = g.op("Add", [g.unsq(g.op("Sub", [fi.offset, g.const(km)]), [1]), g.const(np.arange(K)[None, :])])
    taps = g.op("Gather", [ext, source(fi.row, g.op("Gather", [fi.starts, fi.row]), rel)], "taps", axis=0)
    kernel = g.initializer(p + "conv.weight_kc", _w(weights, p + "conv.weight").T.copy())   # [K, C]
    y = g.op("ReduceSum", [g.op("Mul", [taps, kernel], "taps/Mul"), g.const([1])], "conv", keepdims=0)
    if capture:
        # token t's taps are the K inputs ending at t (rel offset-K+1 .. offset), so the K-1 inputs
        # ending at t (the state had the chunk ended there) are already gathered: drop the oldest
        after = g.op("Slice", [taps, g.const([1]), g.const([K]), g.const([1])], "per_token/Slice")  # [N, K-1, C]
        g.op("Transpose", [after], "per_token/Transpose", outputs=[capture_name(PRESENT_CONV % layer)],
             perm=[0, 2, 1])
    rel = g.op("Add", [g.unsq(g.op("Sub", [fi.qlen, g.const(km)]), [1]), g.const(np.arange(km)[None, :])])
    last = g.op("Gather", [ext, source(fi.row_ids, fi.starts, rel)], "last_inputs", axis=0)  # [B, K-1, C]
    g.op("Transpose", [last], "present/Transpose", outputs=[PRESENT_CONV % layer], perm=[0, 2, 1])
    return g.op("Gemm", [y, g.initializer(p + "out_proj.weight", _w(weights, p + "out_proj.weight"))],
                "out_proj", transB=1)


def _recurrent_layer(g: GraphBuilder, spec: DecoderSpec, layer: int, h: str, fi: FixedIndices, weights,
                     capture: bool = False) -> str:
    """The linear recurrence in closed form over each row's chunk (see the module docstring); with
    `capture` also the state after every packed token."""
    p = f"model.layers.{layer}.linear_attn."
    nH, D = spec.num_heads, spec.head_dim
    scale = np.float32(1.0 / np.sqrt(D))
    qkv_w = np.concatenate([_w(weights, p + "q_proj.weight") * scale, _w(weights, p + "k_proj.weight"),
                            _w(weights, p + "v_proj.weight")], axis=0)
    qkv = g.op("Gemm", [h, g.initializer(p + "qkv_proj.weight", qkv_w)], "qkv_proj", transB=1)
    q, k, v = (g.reshape(part, g.const([-1, nH, D]))
               for part in g.op("Split", [qkv, g.const([nH * D] * 3)], "qkv/Split", n_out=3, axis=1))
    decay = _w(weights, p + "decay").astype(np.float64)
    log_a = g.initializer(p + "log_a", (-np.logaddexp(0.0, -decay)).astype(np.float32))   # log sigmoid, [nH]

    def power(exponent):                                   # a^exponent, exponent float [..., 1]
        return g.op("Exp", [g.op("Mul", [exponent, log_a])], "power")

    # within the chunk: decayed causal mask over the same row's tokens
    dec = g.op("Exp", [g.op("Mul", [g.unsq(fi.distance, [0]), g.reshape(log_a, g.const([nH, 1, 1]))])])
    dec = g.op("Where", [g.unsq(fi.same_row, [0]), dec, g.const(0.0, np.float32)], "decay_mask")  # [nH, N, N]
    qh = g.op("Transpose", [q], perm=[1, 0, 2])
    kh = g.op("Transpose", [k], perm=[1, 2, 0])
    vh = g.op("Transpose", [v], perm=[1, 0, 2])
    scores = g.op("Mul", [g.op("MatMul", [qh, kh], "QK"), dec], "decayed")
    intra = g.op("Transpose", [g.op("MatMul", [scores, vh], "PV")], perm=[1, 0, 2])          # [N, nH, D]
    # from the state: a^(offset+1) q_t S_0
    s0 = g.op("Gather", [PAST_RECURRENT % layer, fi.row], "state/Gather", axis=0)          # [N, nH, D, D]
    qs = g.op("MatMul", [g.unsq(q, [2]), s0], "qS")                                         # [N, nH, 1, D]
    steps = g.op("Cast", [g.op("Add", [fi.offset, g.const(1)])], to=TensorProto.FLOAT)
    qs = g.op("Mul", [g.reshape(qs, g.const([-1, nH, D])), g.unsq(power(g.unsq(steps, [1])), [2])], "from_state")
    o = g.reshape(g.op("Add", [intra, qs], "o"), g.const([-1, nH * D]))
    # the state after the row's last token
    remaining = g.op("Sub", [g.op("Sub", [g.op("Gather", [fi.qlen, fi.row]), fi.offset]), g.const(1)])
    kw = g.op("Mul", [k, g.unsq(power(g.unsq(g.op("Cast", [remaining], to=TensorProto.FLOAT), [1])), [2])],
              "k_weighted")                                                                  # [N, nH, D]
    outer = g.op("Mul", [g.unsq(kw, [3]), g.unsq(v, [2])], "outer")                           # [N, nH, D, D]
    added = g.op("MatMul", [fi.membership, g.reshape(outer, g.const([-1, nH * D * D]))], "row_sums")
    carried = power(g.unsq(g.op("Cast", [fi.qlen], to=TensorProto.FLOAT), [1]))               # [B, nH]
    carried = g.op("Mul", [PAST_RECURRENT % layer, g.unsq(carried, [2, 3])], "carried")
    g.op("Add", [carried, g.reshape(added, g.shape_of(fi.rows, nH, D, D))], "present",
         outputs=[PRESENT_RECURRENT % layer])
    if capture:
        # S_t = a^(offset+1) S_0 + sum_{s<=t, same row} a^(t-s) k_s^T v_s: the decay mask already
        # holds a^(t-s) on exactly those (t, s), so one batched MatMul over the flattened outer
        # products sums every token's contributions at once
        kv = g.op("Mul", [g.unsq(k, [3]), g.unsq(v, [2])], "per_token/outer")                # [N, nH, D, D]
        kv = g.op("Transpose", [g.reshape(kv, g.const([-1, nH, D * D]))], perm=[1, 0, 2])   # [nH, N, D*D]
        summed = g.op("Transpose", [g.op("MatMul", [dec, kv], "per_token/sums")], perm=[1, 0, 2])
        from_s0 = g.op("Mul", [s0, g.unsq(power(g.unsq(steps, [1])), [2, 3])], "per_token/carried")
        g.op("Add", [from_s0, g.reshape(summed, g.const([-1, nH, D, D]))], "per_token",
             outputs=[capture_name(PRESENT_RECURRENT % layer)])                             # [N, nH, D, D]
    return g.op("Gemm", [o, g.initializer(p + "o_proj.weight", _w(weights, p + "o_proj.weight"))], "o_proj",
                transB=1)


# --------------------------------------------------------------------------------------------

def logits_rows(per_token_logits: bool, logits_indices: bool) -> str:
    """The symbolic first dimension of the logits: one row per selected token, per packed token, or
    per request (OGA's convention for a dimension named batch_size)."""
    return "num_logits" if logits_indices else ("num_tokens" if per_token_logits else "batch_size")


def declare_io(g: GraphBuilder, spec: DecoderSpec, block_size: int, cache_type: int, logits_type: int,
               per_token_logits: bool, logits_indices: bool, state_capture: bool = False,
               fixed_state_type: int | None = None):
    """Graph inputs and outputs of OGA's paged contract (shared by the CPU and CUDA builders);
    `state_capture` adds the per-token fixed state outputs (see the module docstring). Fixed
    states have `fixed_state_type` (default: the KV caches' `cache_type`)."""
    fixed_state_type = cache_type if fixed_state_type is None else fixed_state_type
    if per_token_logits and logits_indices:
        raise ValueError("per_token_logits and logits_indices are mutually exclusive")
    if state_capture and not per_token_logits:
        raise ValueError("state_capture (per-token fixed state outputs) needs per_token_logits: the states "
                         "serve draft verification, which reads one logits row per packed token")
    if state_capture and not spec.hybrid():
        raise ValueError("state_capture needs a hybrid decoder (conv / recurrent layer_types): the spec has no "
                         "fixed state to capture")
    g.input(INPUT_IDS, TensorProto.INT64, ["num_tokens"])
    g.input(CU_SEQLENS, TensorProto.INT32, ["batch_size + 1"])
    g.input(PAST_SEQLENS, TensorProto.INT32, ["batch_size"])
    g.input(BLOCK_TABLE, TensorProto.INT32, ["batch_size", "max_blocks"])
    ring = set(spec.ring_layers())
    if ring:
        g.input(BLOCK_TABLE_WINDOWED, TensorProto.INT32, ["batch_size", "max_blocks"])
    g.input(ATTENTION_METADATA, TensorProto.INT32, [3])
    if logits_indices:
        g.input(LOGITS_INDICES, TensorProto.INT32, ["num_logits"])

    def cache_shape(layer):
        return ["window_blocks" if layer in ring else "num_blocks", block_size, spec.num_kv_heads, spec.head_dim]

    paged = spec.attention_layers()
    for i in paged:
        g.input(PAST_KEY % i, cache_type, cache_shape(i))
        g.input(PAST_VALUE % i, cache_type, cache_shape(i))
    fixed = fixed_state_shapes(spec)
    for past, _, shape in fixed:
        g.input(past, fixed_state_type, ["batch_size"] + list(shape))
    g.output(LOGITS, logits_type, [logits_rows(per_token_logits, logits_indices), spec.vocab_size])
    for i in paged:
        g.output(PRESENT_KEY % i, cache_type, cache_shape(i))
        g.output(PRESENT_VALUE % i, cache_type, cache_shape(i))
    for _, present, shape in fixed:
        g.output(present, fixed_state_type, ["batch_size"] + list(shape))
    if state_capture:
        for _, present, shape in fixed:
            g.output(capture_name(present), fixed_state_type, ["num_tokens"] + list(shape))


def fixed_state_shapes(spec: DecoderSpec) -> list[tuple[str, str, tuple[int, ...]]]:
    """(input name, output name, per-row shape) of every fixed state tensor: the conv layers', then
    the recurrent layers' (the order of genai_config's state_groups)."""
    conv = [(PAST_CONV % i, PRESENT_CONV % i, (spec.hidden_size, int(spec.conv_kernel) - 1))
            for i in spec.conv_layers()]
    rec = [(PAST_RECURRENT % i, PRESENT_RECURRENT % i, (spec.num_heads, spec.head_dim, spec.head_dim))
           for i in spec.recurrent_layers()]
    return conv + rec


def default_state_capture(spec: DecoderSpec, per_token_logits: bool, state_capture: bool | None) -> bool:
    """`state_capture` resolved: None means on for hybrid decoders with per-token logits (the ones
    that can verify drafts), off otherwise."""
    if state_capture is None:
        return bool(per_token_logits) and spec.hybrid()
    return bool(state_capture)


def refuse_features(spec: DecoderSpec, graph: str) -> None:
    """NotImplementedError naming the spec's features beyond the Llama layout (DecoderSpec.features),
    for graphs that do not implement them yet (the CPU graphs implement them all)."""
    features = spec.features()
    if features:
        raise NotImplementedError(f"{graph} does not implement {', '.join(features)} yet, needed for "
                                  f"{spec.architecture}; build for the cpu target")


def build_cpu_graph(spec: DecoderSpec, weights, *, block_size: int = 16, per_token_logits: bool = False,
                    logits_indices: bool = False, state_capture: bool | None = None) -> onnx.ModelProto:
    """The fp32 paged decoder (see the module docstring) as an in-memory ModelProto. `state_capture`
    adds the per-token fixed state outputs (None: on for hybrid decoders with per_token_logits)."""
    spec.check()
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    capture = default_state_capture(spec, per_token_logits, state_capture)
    g = GraphBuilder()
    declare_io(g, spec, block_size, TensorProto.FLOAT, TensorProto.FLOAT, per_token_logits, logits_indices,
               state_capture=capture)

    embed = g.initializer("model.embed_tokens.weight", _w(weights, "model.embed_tokens.weight"))
    head = embed if spec.tie_word_embeddings else g.initializer("lm_head.weight", _w(weights, "lm_head.weight"))

    def norm_weight(name):   # the norm's scale: the weight plus the spec's offset (Gemma: 1 + w)
        w = _w(weights, name)
        return g.initializer(name, w + np.float32(spec.norm_offset) if spec.norm_offset else w)

    def residual(x, out, layer, which):
        if spec.output_norms:
            out = _rms_norm(g, out, norm_weight(f"model.layers.{layer}.{which}_output_norm.weight"),
                            spec.rms_norm_eps, f"{which}_output_norm")
        if spec.residual_multiplier != 1.0:
            out = g.op("Mul", [out, g.const(np.float32(spec.residual_multiplier), np.float32)], "residual_multiplier")
        return g.op("Add", [x, out], "residual")

    norm = norm_weight("model.norm.weight")
    idx = _step_indices(g, spec, block_size)
    ring = set(spec.ring_layers())
    fixed = _fixed_indices(g) if spec.hybrid() else None
    x = _embeddings(g, embed)
    if spec.embedding_multiplier != 1.0:
        x = g.op("Mul", [x, g.const(np.float32(spec.embedding_multiplier), np.float32)], "embed_tokens/multiplier")
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        kind = spec.layer_type(i)
        g.scope = f"layers.{i}/" + {"attention": "attn", "conv": "conv", "recurrent": "recurrent"}[kind]
        ln1 = norm_weight(p + "input_layernorm.weight")
        h = _rms_norm(g, x, ln1, spec.rms_norm_eps, "input_layernorm")
        if kind == "conv":
            a = _conv_layer(g, spec, i, h, fixed, weights, capture=capture)
        elif kind == "recurrent":
            a = _recurrent_layer(g, spec, i, h, fixed, weights, capture=capture)
        else:
            qkv_w, qkv_b, o_w, _, _ = fused_layer_weights(spec, weights, i, scale_query=not spec.qk_norm)
            qk_norms = None
            if spec.qk_norm:
                qk_norms = (norm_weight(p + "self_attn.q_norm.weight"), norm_weight(p + "self_attn.k_norm.weight"))
            a = _attention(g, spec, i, h, idx,
                           g.initializer(p + "self_attn.qkv_proj.weight", qkv_w),
                           g.initializer(p + "self_attn.qkv_proj.bias", qkv_b) if qkv_b is not None else None,
                           g.initializer(p + "self_attn.o_proj.weight", o_w), ring=i in ring, qk_norms=qk_norms)
        x = residual(x, a, i, "attention")
        gate_up_w = np.concatenate([_w(weights, p + "mlp.gate_proj.weight"),
                                    _w(weights, p + "mlp.up_proj.weight")], axis=0)
        down_w = _w(weights, p + "mlp.down_proj.weight")
        g.scope = f"layers.{i}/mlp"
        ln2 = norm_weight(p + "post_attention_layernorm.weight")
        h = _rms_norm(g, x, ln2, spec.rms_norm_eps, "post_attention_layernorm")
        m = _mlp(g, spec, h, g.initializer(p + "mlp.gate_up_proj.weight", gate_up_w),
                 g.initializer(p + "mlp.down_proj.weight", down_w))
        x = residual(x, m, i, "mlp")
    _lm_head(g, spec, x, norm, head, per_token_logits, logits_indices)
    doc = f"oga.models CPU paged decoder ({spec.architecture}, block_size {block_size}"
    if ring:
        doc += f", sliding-window ring layers {sorted(ring)} of window {spec.sliding_window}"
    if spec.hybrid():
        doc += f", layer types {list(spec.layer_types)}"
    if capture:
        doc += ", per-token fixed state outputs"
    return g.model("oga_paged_decoder_cpu", [("", OPSET)], doc=doc + ")")
