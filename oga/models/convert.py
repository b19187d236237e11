"""Convert a model directory made by onnxruntime-genai's builder for CPU into a paged decoder.

    oga.models.convert("phi3-cpu-int4", "phi3-cpu-int4-paged")      # or: oga convert SRC DST

OGA's builder (`-e cpu`, fp32 or int4) writes decoders whose attention is
com.microsoft.GroupQueryAttention over contiguous caches `past_key_values.%d.key/value`
[batch, kv_heads, past, head_dim], fed by an `attention_mask` ([batch, total]) through a small
subgraph (ReduceSum - 1 -> seqlens_k, Shape -> total_sequence_length), with [batch, sequence]
input_ids and [batch, sequence, vocab] logits. Such a directory runs only on static batching. The
conversion gives it oga's paged contract (onnx_cpu.py's module docstring) and rewrites only what that
contract changes; every other node (norms, MLPs, activations, experts, embeddings, multipliers) is
carried as it is, whatever its operator:

- attention: every GroupQueryAttention node becomes oga.PagedGroupQueryAttention with the same
  query / key / value, RoPE tables, attention sinks (`head_sink`) and attributes (scale, softcap,
  rotary, `local_window_size`), over paged caches [num_blocks, block_size, kv_heads, head_dim] under
  the same names, plus block_table, cumulative_sequence_lengths and past_sequence_lengths;
- LongRoPE (Phi-3.5, Phi-4-mini): the builder's `If` that picks the short or the long RoPE tables
  for the whole batch when the total length passes original_max_position_embeddings becomes a choice
  per row: both tables go to the attention node (`rope_switch_length`), and each row uses the long one
  once its own length passes the switch. A request alone gets 0.18's tables at every step; a batch
  whose rows sit on both sides of the switch gets, per row, what that row would get alone (0.18's
  padded batch gives every row the table of the longest);
- sliding windows: windowed layers keep their window in the attention node; when every windowed
  layer has the same window and a ring of blocks per request (chunk + window - 1 positions) is
  smaller than the context, those layers keep their KV in a ring (`block_table_windowed`,
  model.decoder.sliding_window, search.chunk_size; prefix caching then stays off, as in 0.18);
- short-convolution layers (LFM2, LFM2-MoE): every com.microsoft.CausalConvWithState becomes
  oga.PackedCausalConv with the same kernel and bias over packed rows, each row continuing from its own
  state; the states (`past_conv` / `present_conv`, [batch_size, channels, kernel - 1]) become a
  `fixed_conv` state group, which the engine keeps per request in its fixed-state pool (checkpointed
  for prefix caching, recomputed on preemption);
- the packed token layout: input_ids (and position_ids, for graphs that rotate outside attention)
  become packed [num_tokens], seen by the graph as [1, num_tokens] (one Unsqueeze each), so every
  token-wise node runs unchanged over all rows' tokens;
- the rows that reach the LM head: only the last token of each row (a Reshape and a Gather in front
  of the head), so logits are [batch_size, vocab]; what the graph does to the logits after the head
  (Gemma2's final softcap, Granite's scale) is kept after that selection;
- quantized linears: every com.microsoft.MatMulNBits at accuracy_level 4 (int8 activations, what
  0.18's int4 builds use) becomes oga.QuantizedLinear over the same initializers (its kernels stream
  the weights faster and give a row the same bits alone and in any batch); `quantized_linear=False`
  keeps ONNX Runtime's MatMulNBits;
- the attention_mask subgraph, now unused, is removed, and attention_metadata is declared;
- initializers are untouched: an external-data file (model.onnx.data) is copied byte for byte and
  model.onnx keeps pointing into it;
- genai_config.json gets the paged input names, the paged_kv state group and
  engine.dynamic_batching; every other file (tokenizer, chat template) is copied.

What cannot be converted is refused before anything is written, naming the node, its op and why: a
graph input with no paged counterpart, an operator that mixes tokens
along the sequence (its packed rows would mix too), GroupQueryAttention with an attention bias or an
attribute the paged operator lacks, an attention_mask used by anything else, logits that do not come
out of an LM head. The result needs oga's operator library (oga's executor registers it;
onnxruntime-genai 0.18 cannot run it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

from . import genai_config as cfg

MS = "com.microsoft"
OGA = "oga"

# Operators that combine tokens along the sequence axis: over packed rows they would combine the
# tokens of different requests, so a graph that has them (outside attention) is refused.
SEQUENCE_MIXING_OPS = {"Conv", "ConvTranspose", "CumSum", "Scan", "Loop", "LSTM", "GRU", "RNN", "If"}
# GroupQueryAttention inputs 0..4 (query, key, value, past key, past value) map onto the paged
# operator's 0..4; 5..6 (seqlens_k, total_sequence_length) give way to the paged row metadata;
# 7..8 (cos, sin) map onto 8..9, 11 (head_sink) onto 12; 9 (position ids) must be the graph's packed
# position_ids (the paged operator derives the same positions from the row metadata); 10 (attention
# bias) has no counterpart.
GQA_COS, GQA_SIN, GQA_POSITION_IDS, GQA_ATTENTION_BIAS, GQA_HEAD_SINK = 7, 8, 9, 10, 11
PAGED_COS, PAGED_HEAD_SINK, PAGED_COS_LONG = 8, 12, 13
CARRIED_ATTRIBUTES = ("num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved", "local_window_size",
                      "softcap")
# Attributes that say how 0.18 lays out its contiguous caches, which the paged caches replace.
CACHE_LAYOUT_ATTRIBUTES = ("sliding_window_cache",)
# com.microsoft.CausalConvWithState attributes and the values a packed convolution implements.
CONV_ATTRIBUTES = {"ndim": 1, "dilation": 1, "state_window": 0, "channels_last": 0, "state_update_capacity": 0}
CONV_ACTIVATIONS = {b"none": 0, b"silu": 1, b"swish": 1}
# Operators allowed between the LM head and the logits output: each maps a row of logits to a row.
LOGITS_ROW_OPS = {"Mul", "Div", "Add", "Sub", "Tanh", "Cast", "Identity", "Softcap"}
LM_HEAD_OPS = {"MatMul", "MatMulNBits", "Gemm"}


class ConversionError(ValueError):
    """The source directory cannot be converted; nothing was written."""


def _node_text(node) -> str:
    domain = f"{node.domain}." if node.domain else ""
    return f"node '{node.name}' ({domain}{node.op_type})"


def _attributes(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _check_config(config: dict, src: str) -> dict:
    model = config.get("model", {})
    if "dynamic_batching" in config.get("engine", {}):
        raise ConversionError(f"{src}: already a paged decoder (genai_config.json has engine.dynamic_batching)")
    decoder = model.get("decoder", {})
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    for section, key in ((inputs, "past_key_names"), (inputs, "past_value_names"), (inputs, "attention_mask"),
                         (outputs, "present_key_names"), (outputs, "present_value_names")):
        if key not in section:
            raise ConversionError(f"{src}: model.decoder lacks {key} (not a contiguous-cache decoder of OGA's builder)")
    for key in ("num_hidden_layers", "num_key_value_heads", "head_size", "hidden_size"):
        if not isinstance(decoder.get(key), int) or decoder[key] <= 0:
            raise ConversionError(f"{src}: model.decoder.{key} must be a positive integer, got {decoder.get(key)!r}")
    providers = [next(iter(p)) for p in decoder.get("session_options", {}).get("provider_options", []) if p]
    if any(p != "cpu" for p in providers):
        raise ConversionError(f"{src}: built for {', '.join(providers)}; only CPU builds are converted")
    return decoder


class _Names:
    """The decoder's graph names from genai_config.json, and its attention layers (those whose
    past key / value caches are graph inputs)."""

    def __init__(self, decoder: dict, graph_inputs: dict, graph_outputs: dict, name: str):
        inputs, outputs = decoder["inputs"], decoder["outputs"]
        self.input_ids = inputs.get("input_ids", "input_ids")
        self.position_ids = inputs.get("position_ids", "position_ids")
        self.attention_mask = inputs["attention_mask"]
        self.logits = outputs.get("logits", "logits")
        layers = int(decoder["num_hidden_layers"])
        self.layers = [i for i in range(layers) if inputs["past_key_names"] % i in graph_inputs]
        if not self.layers:
            raise ConversionError(f"{name}: the graph has no input '{inputs['past_key_names'] % 0}' (named by "
                                  "genai_config.json) nor any other layer's past key")
        self.past = {}       # past cache input -> (layer, "key" / "value")
        self.present = []
        for i in self.layers:
            for kind in ("key", "value"):
                past, present = inputs[f"past_{kind}_names"] % i, outputs[f"present_{kind}_names"] % i
                if past not in graph_inputs:
                    raise ConversionError(f"{name}: the graph has no input '{past}' (genai_config.json names it)")
                if present not in graph_outputs:
                    raise ConversionError(f"{name}: the graph has no output '{present}' (genai_config.json names it)")
                self.past[past] = (i, kind)
                self.present.append(present)
        for required in (self.input_ids, self.attention_mask):
            if required not in graph_inputs:
                raise ConversionError(f"{name}: the graph has no input '{required}' (genai_config.json names it)")
        if self.logits not in graph_outputs:
            raise ConversionError(f"{name}: the graph has no output '{self.logits}' (genai_config.json names it)")
        self.has_position_ids = self.position_ids in graph_inputs
        # short-convolution layers (LFM2): a fixed-size state per request, past_conv / present_conv
        self.conv_layers, self.conv_past = [], {}
        past_conv, present_conv = inputs.get("past_conv_names"), outputs.get("present_conv_names")
        if past_conv and present_conv:
            for i in range(layers):
                if past_conv % i in graph_inputs:
                    if present_conv % i not in graph_outputs:
                        raise ConversionError(f"{name}: the graph has no output '{present_conv % i}' "
                                              "(genai_config.json names it)")
                    self.conv_layers.append(i)
                    self.conv_past[past_conv % i] = i
        known = {self.input_ids, self.attention_mask, *self.past, *self.conv_past} | (
            {self.position_ids} if self.has_position_ids else set())
        extra = sorted(set(graph_inputs) - known)
        if extra:
            raise ConversionError(f"{name}: the graph takes inputs the paged contract has no counterpart for: "
                                  f"{', '.join(extra)}")


def _constant_tensors(graph) -> dict:
    """name -> TensorProto of every initializer and Constant node output of `graph`."""
    found = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and not node.domain:
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                found[node.output[0]] = value
    return found


def _long_rope(graph, attention, name: str) -> dict | None:
    """LongRoPE's `If`: the node that feeds the attention nodes' cos / sin, its condition
    Greater(total length, switch), and its two branches' tables. Returns {if_output: (branch,
    index)} and rewrites nothing; None when the graph has no such If."""
    from onnx import numpy_helper

    rope_inputs = {x for n in attention for x in list(n.input)[GQA_COS:GQA_SIN + 1] if x}
    ifs = [n for n in graph.node if n.op_type == "If" and set(n.output) & rope_inputs]
    if not ifs:
        return None
    if len(ifs) > 1:
        raise ConversionError(f"{name}: {len(ifs)} If nodes choose RoPE tables; the conversion handles one")
    node = ifs[0]
    producers = {o: n for n in graph.node for o in n.output}
    condition = producers.get(node.input[0])
    constants = _constant_tensors(graph)
    switch = None
    if condition is not None and condition.op_type == "Greater" and condition.input[1] in constants:
        value = numpy_helper.to_array(constants[condition.input[1]]).reshape(-1)
        if value.size == 1:
            switch = int(value[0])
    if switch is None or switch <= 0:
        raise ConversionError(f"{name}: {_node_text(node)} chooses RoPE tables on a condition other than "
                              "Greater(total sequence length, a positive constant); it cannot be made per row")
    branches = {}
    for attribute in node.attribute:
        if attribute.name not in ("then_branch", "else_branch"):
            continue
        tables = []
        sub = attribute.g
        sub_constants = _constant_tensors(sub)
        for output in sub.output:
            tensor = sub_constants.get(output.name) or constants.get(output.name)
            if tensor is None:
                raise ConversionError(f"{name}: {_node_text(node)}'s {attribute.name} computes its RoPE table "
                                      f"'{output.name}' instead of holding it; it cannot be made per row")
            tables.append(numpy_helper.to_array(tensor))
        branches[attribute.name] = tables
    if len(branches) != 2 or len(branches["then_branch"]) != len(node.output):
        raise ConversionError(f"{name}: {_node_text(node)} lacks a branch holding its RoPE tables")
    return {"node": node, "switch": switch, "long": branches["then_branch"], "short": branches["else_branch"]}


def _replace_long_rope(graph, rope: dict):
    """The If's outputs become initializers (the short tables under the If's output names, the long
    ones beside them); returns {short table name: long table name}. The builder's short tables hold
    only the positions below the switch, the only ones a row that uses them reaches (its length is at
    most the switch); they are padded with zeros to the long tables' length, which the operator wants."""
    import numpy as np
    from onnx import numpy_helper
    pairs = {}
    for output, short, long in zip(rope["node"].output, rope["short"], rope["long"]):
        if short.ndim != 2 or long.ndim != 2 or short.shape[1] != long.shape[1] or \
                not rope["switch"] <= short.shape[0] <= long.shape[0]:
            raise ConversionError(f"LongRoPE tables '{output}' of shapes {short.shape} (short) and {long.shape} "
                                  f"(long) do not cover {rope['switch']} positions with the short one")
        short = np.concatenate([short, np.zeros((long.shape[0] - short.shape[0], short.shape[1]), short.dtype)])
        graph.initializer.append(numpy_helper.from_array(short, output))
        graph.initializer.append(numpy_helper.from_array(long, output + "/long"))
        pairs[output] = output + "/long"
    graph.node.remove(rope["node"])
    return pairs


def _convert_attention(node, names: _Names, name: str, ring_layers: set, rope_pairs: dict, switch: int):
    """The PagedGroupQueryAttention node that replaces GroupQueryAttention `node`."""
    from onnx import helper

    attrs = _attributes(node)
    unknown = sorted(set(attrs) - set(CARRIED_ATTRIBUTES) - set(CACHE_LAYOUT_ATTRIBUTES) -
                     {"smooth_softmax", "qk_output"})
    if unknown:
        raise ConversionError(f"{name}: {_node_text(node)} has attribute(s) {', '.join(unknown)}, which "
                              "oga.PagedGroupQueryAttention does not implement")
    for flag in ("smooth_softmax", "qk_output"):
        if int(attrs.get(flag, 0)) != 0:
            raise ConversionError(f"{name}: {_node_text(node)} has {flag} {attrs[flag]}, which "
                                  "oga.PagedGroupQueryAttention does not implement")
    inputs = list(node.input) + [""] * (GQA_HEAD_SINK + 1 - len(node.input))
    if len(node.input) > GQA_HEAD_SINK + 1 or inputs[GQA_ATTENTION_BIAS]:
        raise ConversionError(f"{name}: {_node_text(node)} takes an attention bias, which has no paged counterpart")
    if inputs[GQA_POSITION_IDS] and inputs[GQA_POSITION_IDS] != names.position_ids:
        raise ConversionError(f"{name}: {_node_text(node)} takes position ids '{inputs[GQA_POSITION_IDS]}' other "
                              f"than the graph's input '{names.position_ids}'")
    past_key, past_value = inputs[3], inputs[4]
    if names.past.get(past_key, (None, None))[1] != "key" or names.past.get(past_value, (None, None))[1] != "value" \
            or names.past[past_key][0] != names.past[past_value][0]:
        raise ConversionError(f"{name}: {_node_text(node)} does not read its layer's caches from graph inputs")
    layer = names.past[past_key][0]
    table = "block_table_windowed" if layer in ring_layers else "block_table"
    cos, sin = inputs[GQA_COS], inputs[GQA_SIN]
    paged = inputs[:5] + [table, "cumulative_sequence_lengths", "past_sequence_lengths", cos, sin, "", "",
                          inputs[GQA_HEAD_SINK]]
    kept = {k: v for k, v in attrs.items() if k in CARRIED_ATTRIBUTES}
    if cos in rope_pairs:
        paged += [rope_pairs[cos], rope_pairs[sin]]
        kept["rope_switch_length"] = switch
    while paged and not paged[-1]:
        paged.pop()
    return helper.make_node("PagedGroupQueryAttention", paged, list(node.output), name=node.name, domain=OGA, **kept)


def _convert_convolution(node, names: _Names, name: str):
    """The oga.PackedCausalConv node that replaces CausalConvWithState `node`: the same input, kernel
    and bias over packed rows, each row continuing from its own state (a fixed_conv state group)."""
    from onnx import helper

    attrs = _attributes(node)
    for key, value in attrs.items():
        if key == "activation":
            if value not in CONV_ACTIVATIONS:
                raise ConversionError(f"{name}: {_node_text(node)} has activation {value!r}, which "
                                      "oga.PackedCausalConv does not implement")
        elif key not in CONV_ATTRIBUTES or int(value) != CONV_ATTRIBUTES[key]:
            raise ConversionError(f"{name}: {_node_text(node)} has {key} {value}, which oga.PackedCausalConv "
                                  "does not implement")
    inputs = list(node.input) + [""] * (4 - len(node.input))
    if len(node.input) > 4 or inputs[3] not in names.conv_past:
        raise ConversionError(f"{name}: {_node_text(node)} does not read its layer's state from a past_conv "
                              "graph input")
    outputs = list(node.output)
    if len(outputs) > 2 and outputs[2]:
        raise ConversionError(f"{name}: {_node_text(node)} writes a state update, which has no paged counterpart")
    return helper.make_node("PackedCausalConv", inputs[:4] + ["cumulative_sequence_lengths"], outputs[:2],
                            name=node.name, domain=OGA, silu=CONV_ACTIVATIONS[attrs.get("activation", b"none")])


def _oga_quantized_linears(graph) -> int:
    """MatMulNBits nodes at accuracy_level 4 (int8 activations) become oga.QuantizedLinear over the same
    inputs (A, B, scales, uint8 zero points) where it computes them: 4 or 8 bits, blocks of a multiple of
    32, no g_idx or bias, constant weights. Returns how many were replaced."""
    from onnx import TensorProto, helper

    constants = _constant_tensors(graph)
    replaced = 0
    for node in graph.node:
        if node.op_type != "MatMulNBits" or node.domain != MS:
            continue
        attrs = _attributes(node)
        inputs = list(node.input)
        if int(attrs.get("accuracy_level", 0)) != 4 or int(attrs.get("bits", 4)) not in (4, 8) \
                or int(attrs.get("block_size", 0)) % 32 or any(inputs[4:]):
            continue
        weights = [x for x in inputs[1:4] if x]
        if any(x not in constants for x in weights):
            continue
        if len(inputs) > 3 and inputs[3] and constants[inputs[3]].data_type != TensorProto.UINT8:
            continue   # float zero points: MatMulNBits keeps them
        node.CopyFrom(helper.make_node("QuantizedLinear", inputs[:4], list(node.output), name=node.name, domain=OGA,
                                       K=int(attrs["K"]), N=int(attrs["N"]), bits=int(attrs.get("bits", 4)),
                                       block_size=int(attrs["block_size"])))
        replaced += 1
    return replaced


def _pack(graph, name: str):
    """Graph input `name` becomes packed [num_tokens]: its readers see it as [1, num_tokens]."""
    from onnx import TensorProto, helper
    batch = name + "/as_batch_of_one"
    for node in graph.node:
        for i, x in enumerate(node.input):
            if x == name:
                node.input[i] = batch
    axes = helper.make_tensor(batch + "/axes", TensorProto.INT64, [1], [0])
    graph.initializer.append(axes)
    graph.node.insert(0, helper.make_node("Unsqueeze", [name, axes.name], [batch], name=batch))


def _lm_head(graph, logits: str, name: str):
    """The LM head node: the MatMul / MatMulNBits / Gemm the logits come out of, through row-wise
    ops on constants only (Gemma2's softcap, Granite's scale)."""
    producers = {o: n for n in graph.node for o in n.output}
    constants = _constant_tensors(graph)
    value = logits
    while True:
        node = producers.get(value)
        if node is None:
            raise ConversionError(f"{name}: logits come from nothing; the conversion needs an LM head")
        if node.op_type in LM_HEAD_OPS and (node.domain or "") in ("", MS):
            return node
        variable = [x for x in node.input if x and x not in constants]
        if node.op_type not in LOGITS_ROW_OPS or len(variable) != 1:
            raise ConversionError(f"{name}: logits come from {_node_text(node)}; the conversion needs them out of "
                                  "the LM head's MatMul / MatMulNBits / Gemm, through row-wise ops on constants only")
        value = variable[0]


def _select_head_rows(graph, head, hidden: int):
    """The LM head reads the last token of each row only: a Reshape to [tokens, hidden] and a Gather
    of rows cumulative_sequence_lengths[1:] - 1 in front of it."""
    from onnx import TensorProto, helper
    shape = helper.make_tensor("lm_head/rows/shape", TensorProto.INT64, [2], [-1, hidden])
    one = helper.make_tensor("lm_head/rows/one", TensorProto.INT32, [], [1])
    start = helper.make_tensor("lm_head/rows/start", TensorProto.INT64, [1], [1])
    end = helper.make_tensor("lm_head/rows/end", TensorProto.INT64, [1], [2**62])
    graph.initializer.extend([shape, one, start, end])
    at = list(graph.node).index(head)
    rows_nodes = [
        helper.make_node("Reshape", [head.input[0], shape.name], ["lm_head/rows/tokens"], name="lm_head/rows/tokens"),
        helper.make_node("Slice", ["cumulative_sequence_lengths", start.name, end.name], ["lm_head/rows/ends"],
                         name="lm_head/rows/ends"),
        helper.make_node("Sub", ["lm_head/rows/ends", one.name], ["lm_head/rows/last"], name="lm_head/rows/last"),
        helper.make_node("Gather", ["lm_head/rows/tokens", "lm_head/rows/last"], ["lm_head/rows/selected"],
                         name="lm_head/rows/selected", axis=0),
    ]
    for offset, node in enumerate(rows_nodes):
        graph.node.insert(at + offset, node)
    head.input[0] = "lm_head/rows/selected"


def _windows(attention) -> dict:
    """node name -> its local_window_size (> 0), for the windowed attention nodes."""
    windows = {}
    for node in attention:
        window = int(_attributes(node).get("local_window_size", -1))
        if window > 0:
            windows[node.name] = window
    return windows


def plan_ring(attention, names: _Names, *, block_size: int, chunk_size: int | None, context_length: int,
              ring: bool | None) -> tuple[set, int | None]:
    """The layers to keep in a ring and the window: every windowed layer when they share one window,
    at least one layer keeps the whole sequence, and (ring None) the ring saves memory."""
    windows = _windows(attention)
    if not windows or ring is False:
        return set(), None
    sizes = set(windows.values())
    layers = {names.past[n.input[3]][0] for n in attention if n.name in windows}
    possible = len(sizes) == 1 and len(layers) < len(names.layers)
    if ring and not possible:
        raise ConversionError("a ring needs every windowed layer to share one window and at least one layer that "
                              f"keeps the whole sequence (windows {sorted(sizes)} on {len(layers)} of "
                              f"{len(names.layers)} layers)")
    if not possible or chunk_size is None:
        return set(), None
    window = sizes.pop()
    ring_blocks = -(-(chunk_size + window - 1) // block_size)
    if ring is None and ring_blocks >= -(-context_length // block_size):
        return set(), None
    return layers, window


@dataclasses.dataclass
class ConvertedGraph:
    """What convert_graph made, for genai_config.json."""
    model: object                 # the ModelProto
    attention_layers: list        # layer ids with paged KV
    conv_layers: list             # layer ids with a fixed-size convolution state
    position_ids: bool            # the graph takes packed position_ids
    ring_layers: set              # layers whose KV lives in a sliding-window ring
    window: int | None            # the ring layers' window


def convert_graph(model, decoder: dict, *, block_size: int, name: str = "model.onnx", chunk_size: int | None = None,
                  context_length: int = cfg.CPU_DEFAULT_CONTEXT, window_ring: bool | None = None,
                  quantized_linear: bool = True) -> ConvertedGraph:
    """The paged decoder made from OGA's contiguous-cache ModelProto `model` (edited in place)."""
    from onnx import TensorProto, helper

    graph = model.graph
    kv_heads, head_dim = int(decoder["num_key_value_heads"]), int(decoder["head_size"])
    graph_inputs = {i.name: i for i in graph.input}
    graph_outputs = {o.name: o for o in graph.output}
    names = _Names(decoder, graph_inputs, graph_outputs, name)
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention" and n.domain == MS]
    if len(attention) != len(names.layers):
        raise ConversionError(f"{name}: {len(attention)} GroupQueryAttention nodes for {len(names.layers)} "
                              "attention layers")
    ring_layers, window = plan_ring(attention, names, block_size=block_size, chunk_size=chunk_size,
                                    context_length=context_length, ring=window_ring)

    rope = _long_rope(graph, attention, name)
    for node in graph.node:
        if node.op_type in SEQUENCE_MIXING_OPS and not (rope and node is rope["node"]):
            raise ConversionError(f"{name}: {_node_text(node)} combines tokens along the sequence; over packed "
                                  "rows it would combine different requests, so this graph cannot be converted")
    rope_pairs = _replace_long_rope(graph, rope) if rope else {}
    for node in attention:
        node.CopyFrom(_convert_attention(node, names, name, ring_layers, rope_pairs,
                                         rope["switch"] if rope else 0))
    convolutions = [n for n in graph.node if n.op_type == "CausalConvWithState" and n.domain == MS]
    if len(convolutions) != len(names.conv_layers):
        raise ConversionError(f"{name}: {len(convolutions)} CausalConvWithState nodes for "
                              f"{len(names.conv_layers)} layers with a past_conv state")
    for node in convolutions:
        node.CopyFrom(_convert_convolution(node, names, name))

    _pack(graph, names.input_ids)
    if names.has_position_ids:
        _pack(graph, names.position_ids)
    head = _lm_head(graph, names.logits, name)
    _select_head_rows(graph, head, int(decoder["hidden_size"]))
    if quantized_linear:
        _oga_quantized_linears(graph)

    # drop what no output needs any more (the attention_mask subgraph)
    _remove_dead_nodes(graph)
    users = [n for n in graph.node if names.attention_mask in n.input]
    if users:
        raise ConversionError(f"{name}: {_node_text(users[0])} reads {names.attention_mask} for more than the "
                              "attention's sequence lengths; this graph cannot be converted")

    # the paged contract's inputs and outputs
    vocab = graph_outputs[names.logits].type.tensor_type.shape.dim[-1]
    new_inputs = [helper.make_tensor_value_info(names.input_ids, TensorProto.INT64, ["num_tokens"])]
    if names.has_position_ids:
        new_inputs.append(helper.make_tensor_value_info(names.position_ids, TensorProto.INT64, ["num_tokens"]))
    new_inputs += [helper.make_tensor_value_info("cumulative_sequence_lengths", TensorProto.INT32, ["batch_size + 1"]),
                   helper.make_tensor_value_info("past_sequence_lengths", TensorProto.INT32, ["batch_size"]),
                   helper.make_tensor_value_info("block_table", TensorProto.INT32, ["batch_size", "max_blocks"])]
    if ring_layers:
        new_inputs.append(helper.make_tensor_value_info("block_table_windowed", TensorProto.INT32,
                                                        ["batch_size", "max_blocks"]))
    new_inputs.append(helper.make_tensor_value_info("attention_metadata", TensorProto.INT32, [3]))
    cache = ["num_blocks", int(block_size), kv_heads, head_dim]
    for past in names.past:
        elem = graph_inputs[past].type.tensor_type.elem_type
        new_inputs.append(helper.make_tensor_value_info(past, elem, cache))
    conv_presents = [o for o in graph.output if o.name in {decoder["outputs"]["present_conv_names"] % i
                                                           for i in names.conv_layers}]
    new_inputs += [graph_inputs[past] for past in names.conv_past]     # [batch_size, C, K-1], as they were
    del graph.input[:]
    graph.input.extend(new_inputs)
    logits = helper.make_tensor_value_info(names.logits, graph_outputs[names.logits].type.tensor_type.elem_type,
                                           ["batch_size", vocab.dim_value or vocab.dim_param])
    outputs = [logits] + [helper.make_tensor_value_info(p, graph_outputs[p].type.tensor_type.elem_type, cache)
                          for p in names.present] + conv_presents
    del graph.output[:]
    graph.output.extend(outputs)
    del graph.value_info[:]     # the builder's shape hints describe the contiguous layout
    if not any(o.domain == OGA for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(OGA, 1))
    return ConvertedGraph(model, names.layers, names.conv_layers, names.has_position_ids, ring_layers, window)


def _remove_dead_nodes(graph):
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(list(graph.node)):
        if any(out in needed for out in node.output if out):
            keep.append(node)
            needed.update(x for x in node.input if x)
            for attribute in node.attribute:     # names a subgraph reads from this graph
                if attribute.g is not None:
                    needed.update(x for n in attribute.g.node for x in n.input if x)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    alive = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(alive)


def context_length_of(config: dict, context_length: int | None) -> int:
    """The converted directory's context: `context_length`, else search.max_length (or the model's
    context_length) capped at the CPU default."""
    model, search = config.get("model", {}), config.get("search", {})
    return int(context_length or min(int(search.get("max_length", model.get("context_length", 4096))),
                                     cfg.CPU_DEFAULT_CONTEXT))


def convert_config(config: dict, *, block_size: int, num_blocks: int | None, max_batch_size: int,
                   max_scheduled_tokens: int, context_length: int | None, rope_positions: int | None,
                   attention_layers: list, conv_layers=(), position_ids: bool = False, ring_layers=(),
                   window: int | None = None, chunk_size: int | None = None) -> dict:
    """genai_config.json of the converted directory."""
    config = json.loads(json.dumps(config))
    model, search = config["model"], config.setdefault("search", {})
    decoder = model["decoder"]
    length = context_length_of(config, context_length)
    if rope_positions is not None and length > rope_positions:
        raise ConversionError(f"context length {length} is longer than the graph's RoPE tables ({rope_positions} "
                              "positions)")
    model["context_length"] = search["max_length"] = length
    inputs = decoder["inputs"]
    decoder["inputs"] = {
        "input_ids": inputs.get("input_ids", "input_ids"),
        "cumulative_sequence_lengths": "cumulative_sequence_lengths",
        "past_sequence_lengths": "past_sequence_lengths",
        "block_table": "block_table",
        "attention_metadata": "attention_metadata",
        "past_key_names": inputs["past_key_names"],
        "past_value_names": inputs["past_value_names"],
    }
    if conv_layers:
        decoder["inputs"]["past_conv_names"] = inputs["past_conv_names"]
    if position_ids:
        decoder["inputs"]["position_ids"] = inputs.get("position_ids", "position_ids")
    # 0.18's contiguous sliding-window cache layout does not apply to paged caches; a ring replaces it
    decoder.pop("sliding_window", None)
    if ring_layers:
        decoder["inputs"]["block_table_windowed"] = "block_table_windowed"
        decoder["sliding_window"] = {"window_size": int(window), "layers": sorted(ring_layers)}
        search["chunk_size"] = int(chunk_size)
    decoder["state_groups"] = [{"kind": "paged_kv", "layer_ids": list(attention_layers)}]
    if conv_layers:
        decoder["state_groups"].append({"kind": "fixed_conv", "layer_ids": list(conv_layers)})
    search["past_present_share_buffer"] = True
    config.setdefault("engine", {})["dynamic_batching"] = {
        "block_size": int(block_size), "max_batch_size": int(max_batch_size),
        "max_scheduled_tokens": int(max_scheduled_tokens),
        "num_blocks": int(num_blocks if num_blocks is not None
                          else cfg.default_num_blocks(length, block_size, max_batch_size)),
    }
    return config


def convert(src, dst, *, block_size: int = cfg.CPU_BLOCK_SIZE, num_blocks: int | None = None,
            max_batch_size: int = cfg.DEFAULT_MAX_BATCH_SIZE,
            max_scheduled_tokens: int = cfg.DEFAULT_MAX_SCHEDULED_TOKENS, context_length: int | None = None,
            chunk_size: int | None = None, window_ring: bool | None = None, quantized_linear: bool = True,
            progress: bool = False) -> str:
    """Converts OGA builder CPU directory `src` into a paged decoder directory `dst` (which must not
    exist yet) and returns dst. Raises ConversionError, writing nothing, when src cannot be
    converted. `context_length` (default: search.max_length capped at 4096) bounds each request;
    `num_blocks` defaults to `max_batch_size` requests of that length. Sliding-window layers go to a
    ring of blocks per request when `window_ring` is True, or (None) when that saves memory;
    `chunk_size` (default: max_scheduled_tokens) caps a request's tokens per step, which a ring needs.
    `quantized_linear`: MatMulNBits at accuracy_level 4 becomes oga.QuantizedLinear (False: kept)."""
    import onnx

    src, dst = os.fspath(src), os.fspath(dst)
    for name, value in (("block_size", block_size), ("max_batch_size", max_batch_size),
                        ("max_scheduled_tokens", max_scheduled_tokens)):
        if int(value) <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    for name, value in (("num_blocks", num_blocks), ("context_length", context_length), ("chunk_size", chunk_size)):
        if value is not None and int(value) <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if window_ring not in (None, True, False):
        raise ValueError(f"window_ring must be None, True or False, got {window_ring!r}")
    config_path = os.path.join(src, "genai_config.json")
    if not os.path.isfile(config_path):
        raise ConversionError(f"{src}: no genai_config.json (not an onnxruntime-genai model directory)")
    if os.path.exists(dst):
        raise ConversionError(f"{dst} already exists; the converted directory is written to a new path")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    decoder = _check_config(config, src)
    filename = decoder.get("filename", "model.onnx")
    if os.path.basename(filename) != filename:
        raise ConversionError(f"{src}: model.decoder.filename {filename!r} is not a file of the directory")
    model_path = os.path.join(src, filename)
    if not os.path.isfile(model_path):
        raise ConversionError(f"{src}: the decoder file {filename} does not exist")
    model = onnx.load(model_path, load_external_data=False)
    external = sorted({entry.value for t in model.graph.initializer for entry in t.external_data
                       if entry.key == "location"})
    for location in external:
        if os.path.basename(location) != location or not os.path.isfile(os.path.join(src, location)):
            raise ConversionError(f"{src}: external data file {location!r} is missing or outside the directory")

    length = context_length_of(config, context_length)
    chunk = int(chunk_size or max_scheduled_tokens)
    graph = convert_graph(model, decoder, block_size=block_size, name=filename, chunk_size=chunk,
                          context_length=length, window_ring=window_ring, quantized_linear=quantized_linear)
    model = graph.model
    cos_names = {n.input[PAGED_COS] for n in model.graph.node
                 if n.op_type == "PagedGroupQueryAttention" and len(n.input) > PAGED_COS and n.input[PAGED_COS]}
    rope = [t for t in model.graph.initializer if t.name in cos_names]
    rope_positions = min(int(t.dims[0]) for t in rope) if rope else None
    converted = convert_config(config, block_size=block_size, num_blocks=num_blocks, max_batch_size=max_batch_size,
                               max_scheduled_tokens=max_scheduled_tokens, context_length=length,
                               rope_positions=rope_positions, attention_layers=graph.attention_layers,
                               conv_layers=graph.conv_layers,
                               position_ids=graph.position_ids, ring_layers=graph.ring_layers, window=graph.window,
                               chunk_size=chunk)

    parent = os.path.dirname(os.path.abspath(dst))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=os.path.basename(dst) + ".partial-", dir=parent)
    try:
        for entry in sorted(os.listdir(src)):
            source = os.path.join(src, entry)
            if entry in (filename, "genai_config.json") or not os.path.isfile(source):
                continue
            shutil.copyfile(source, os.path.join(staging, entry))     # tokenizer files, external weights
        onnx.save_model(model, os.path.join(staging, filename))
        with open(os.path.join(staging, "genai_config.json"), "w", encoding="utf-8") as f:
            json.dump(converted, f, indent=4)
        os.rename(staging, dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if progress:
        print(f"[oga.models] converted {src} -> {dst}: {layers_text(decoder, graph.attention_layers, graph.ring_layers)}", flush=True)
    return dst


def layers_text(decoder: dict, layers: list, ring_layers=()) -> str:
    ring = f", {len(ring_layers)} of them in a sliding-window ring" if ring_layers else ""
    return (f"{len(layers)} layers of oga.PagedGroupQueryAttention "
            f"({decoder['num_attention_heads']}/{decoder['num_key_value_heads']} heads, head size "
            f"{decoder['head_size']}){ring}")
