"""Convert a model directory made by onnxruntime-genai's builder for CPU into a paged decoder.

    oga.models.convert("phi-cpu-int4", "phi-cpu-int4-paged")        # or: oga convert SRC DST

OGA's builder (`-e cpu`, fp32 or int4) writes a Llama-family decoder whose attention is
com.microsoft.GroupQueryAttention over contiguous caches `past_key_values.%d.key/value`
[batch, kv_heads, past, head_dim], fed by an `attention_mask` ([batch, total]) through a small
subgraph (ReduceSum - 1 -> seqlens_k, Shape -> total_sequence_length), with [batch, sequence]
input_ids and [batch, sequence, vocab] logits. Such a directory runs only on static batching. The
conversion gives it oga's paged contract (onnx_cpu.py's module docstring) and keeps everything else:

- every GroupQueryAttention node becomes oga.PagedGroupQueryAttention with the same query / key /
  value, RoPE tables (cos_cache, sin_cache) and attributes, over paged caches
  [num_blocks, block_size, kv_heads, head_dim] under the same names, plus block_table,
  cumulative_sequence_lengths and past_sequence_lengths;
- input_ids becomes the packed [num_tokens], seen by the graph as [1, num_tokens] (one Unsqueeze),
  so every other node runs unchanged;
- the LM head gets only the last token of each row (a Reshape and a Gather in front of it):
  logits [batch_size, vocab];
- the attention_mask subgraph, now unused, is removed, and attention_metadata is declared;
- initializers are untouched: an external-data file (model.onnx.data) is copied byte for byte and
  model.onnx keeps pointing into it;
- genai_config.json gets the paged input names, the paged_kv state group and
  engine.dynamic_batching; every other file (tokenizer, chat template) is copied.

What cannot be converted is refused before anything is written, naming the node and op: a node
outside the operators such builds use, GroupQueryAttention with softcap, position ids or an
attention bias, an attention_mask used by anything else, a model type that is not Llama-family.
The result needs oga's operator library (oga's executor registers it; onnxruntime-genai 0.18
cannot run it).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from . import genai_config as cfg

MS = "com.microsoft"
OGA = "oga"

# Model types whose OGA CPU builds are the Llama-family decoders this conversion understands.
MODEL_TYPES = ("llama", "qwen2", "mistral")
# The operators of OGA's CPU builds of those models (domain, op type).
KNOWN_OPS = {
    ("", "Constant"), ("", "Gather"), ("", "Shape"), ("", "Cast"), ("", "ReduceSum"), ("", "Sub"), ("", "Add"),
    ("", "Mul"), ("", "MatMul"), ("", "Sigmoid"), ("", "Reshape"), ("", "Unsqueeze"), ("", "Squeeze"),
    ("", "Identity"), ("", "Transpose"), ("", "SimplifiedLayerNormalization"), ("", "Softmax"),
    (MS, "GroupQueryAttention"), (MS, "MatMulNBits"), (MS, "SkipSimplifiedLayerNormalization"),
    (MS, "SimplifiedLayerNormalization"), (MS, "GatherBlockQuantized"), (MS, "QuickGelu"),
}
# GroupQueryAttention inputs 0..4 (query, key, value, past key, past value) and 7..8 (cos, sin)
# map onto PagedGroupQueryAttention's 0..4 and 8..9; 5..6 (seqlens_k, total_sequence_length) give
# way to the paged row metadata; 9.. (position ids, attention bias, head sink) have no counterpart.
GQA_COS, GQA_SIN, GQA_FIRST_UNSUPPORTED = 7, 8, 9
PAGED_COS = 8
CARRIED_ATTRIBUTES = ("num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved", "local_window_size")


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
    kind = model.get("type")
    if kind not in MODEL_TYPES:
        raise ConversionError(f"{src}: model.type {kind!r} is not a Llama-family decoder this conversion "
                              f"understands ({', '.join(MODEL_TYPES)})")
    if "dynamic_batching" in config.get("engine", {}):
        raise ConversionError(f"{src}: already a paged decoder (genai_config.json has engine.dynamic_batching)")
    decoder = model.get("decoder", {})
    inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
    for section, key in ((inputs, "past_key_names"), (inputs, "past_value_names"), (inputs, "attention_mask"),
                         (outputs, "present_key_names"), (outputs, "present_value_names")):
        if key not in section:
            raise ConversionError(f"{src}: model.decoder lacks {key} (not a contiguous-cache decoder of OGA's builder)")
    providers = [next(iter(p)) for p in decoder.get("session_options", {}).get("provider_options", []) if p]
    if any(p != "cpu" for p in providers):
        raise ConversionError(f"{src}: built for {', '.join(providers)}; only CPU builds are converted")
    return decoder


def convert_graph(model, decoder: dict, *, block_size: int, name: str = "model.onnx"):
    """The paged decoder ModelProto made from OGA's contiguous-cache `model` (edited in place)."""
    from onnx import TensorProto, helper

    graph = model.graph
    layers = int(decoder["num_hidden_layers"])
    kv_heads, head_dim = int(decoder["num_key_value_heads"]), int(decoder["head_size"])
    names = {"input_ids": decoder["inputs"].get("input_ids", "input_ids"),
             "attention_mask": decoder["inputs"]["attention_mask"],
             "logits": decoder["outputs"].get("logits", "logits")}
    past_names = [decoder["inputs"]["past_key_names"] % i for i in range(layers)] + \
                 [decoder["inputs"]["past_value_names"] % i for i in range(layers)]
    present_names = [decoder["outputs"]["present_key_names"] % i for i in range(layers)] + \
                    [decoder["outputs"]["present_value_names"] % i for i in range(layers)]

    for node in graph.node:
        if (node.domain or "", node.op_type) not in KNOWN_OPS:
            raise ConversionError(f"{name}: {_node_text(node)} is not an operator of OGA's CPU builds of "
                                  "Llama-family models; this graph cannot be converted")
    graph_inputs = {i.name: i for i in graph.input}
    graph_outputs = {o.name: o for o in graph.output}
    for required in [names["input_ids"], names["attention_mask"]] + past_names:
        if required not in graph_inputs:
            raise ConversionError(f"{name}: the graph has no input '{required}' (genai_config.json names it)")
    for required in [names["logits"]] + present_names:
        if required not in graph_outputs:
            raise ConversionError(f"{name}: the graph has no output '{required}' (genai_config.json names it)")
    extra = sorted(set(graph_inputs) - {names["input_ids"], names["attention_mask"]} - set(past_names))
    if extra:
        raise ConversionError(f"{name}: the graph takes inputs the paged contract has no counterpart for: "
                              f"{', '.join(extra)}")

    # GroupQueryAttention -> PagedGroupQueryAttention
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if len(attention) != layers:
        raise ConversionError(f"{name}: {len(attention)} GroupQueryAttention nodes for {layers} layers")
    for node in attention:
        attrs = _attributes(node)
        if float(attrs.get("softcap", 0.0)) != 0.0:
            raise ConversionError(f"{name}: {_node_text(node)} has softcap {attrs['softcap']}, which "
                                  "oga.PagedGroupQueryAttention does not implement")
        unused = [i for i, x in enumerate(node.input) if i >= GQA_FIRST_UNSUPPORTED and x]
        if unused:
            raise ConversionError(f"{name}: {_node_text(node)} takes input(s) {unused} (position ids, attention "
                                  "bias, head sink), which have no paged counterpart")
        past_key, past_value = node.input[3], node.input[4]
        if past_key not in past_names or past_value not in past_names:
            raise ConversionError(f"{name}: {_node_text(node)} does not read its layer's caches from graph inputs")
        inputs = list(node.input[:5]) + ["block_table", "cumulative_sequence_lengths", "past_sequence_lengths",
                                         node.input[GQA_COS] if len(node.input) > GQA_COS else "",
                                         node.input[GQA_SIN] if len(node.input) > GQA_SIN else ""]
        kept = {k: v for k, v in attrs.items() if k in CARRIED_ATTRIBUTES}
        replacement = helper.make_node("PagedGroupQueryAttention", inputs, list(node.output), name=node.name,
                                       domain=OGA, **kept)
        node.CopyFrom(replacement)

    # packed input_ids: [num_tokens], seen as [1, num_tokens] by the rest of the graph
    ids = names["input_ids"]
    batch_ids = ids + "/as_batch_of_one"
    for node in graph.node:
        for i, x in enumerate(node.input):
            if x == ids:
                node.input[i] = batch_ids
    axes = helper.make_tensor(batch_ids + "/axes", TensorProto.INT64, [1], [0])
    graph.initializer.append(axes)
    graph.node.insert(0, helper.make_node("Unsqueeze", [ids, axes.name], [batch_ids], name=batch_ids))

    # the LM head on the last token of each row only
    head = next((n for n in graph.node if names["logits"] in n.output), None)
    if head is None or head.op_type not in ("MatMul", "MatMulNBits"):
        what = _node_text(head) if head is not None else "nothing"
        raise ConversionError(f"{name}: logits come from {what}; the conversion needs them straight out of the LM "
                              "head's MatMul / MatMulNBits")
    hidden = int(decoder["hidden_size"])
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

    # drop what no output needs any more (the attention_mask subgraph)
    _remove_dead_nodes(graph)
    users = [n for n in graph.node if names["attention_mask"] in n.input]
    if users:
        raise ConversionError(f"{name}: {_node_text(users[0])} reads {names['attention_mask']} for more than the "
                              "attention's sequence lengths; this graph cannot be converted")

    # the paged contract's inputs and outputs
    vocab = graph_outputs[names["logits"]].type.tensor_type.shape.dim[-1]
    new_inputs = [helper.make_tensor_value_info(ids, TensorProto.INT64, ["num_tokens"]),
                  helper.make_tensor_value_info("cumulative_sequence_lengths", TensorProto.INT32, ["batch_size + 1"]),
                  helper.make_tensor_value_info("past_sequence_lengths", TensorProto.INT32, ["batch_size"]),
                  helper.make_tensor_value_info("block_table", TensorProto.INT32, ["batch_size", "max_blocks"]),
                  helper.make_tensor_value_info("attention_metadata", TensorProto.INT32, [3])]
    cache = ["num_blocks", int(block_size), kv_heads, head_dim]
    for past in past_names:
        elem = graph_inputs[past].type.tensor_type.elem_type
        new_inputs.append(helper.make_tensor_value_info(past, elem, cache))
    del graph.input[:]
    graph.input.extend(new_inputs)
    logits = helper.make_tensor_value_info(names["logits"], graph_outputs[names["logits"]].type.tensor_type.elem_type,
                                           ["batch_size", vocab.dim_value or vocab.dim_param])
    outputs = [logits] + [helper.make_tensor_value_info(p, graph_outputs[p].type.tensor_type.elem_type, cache)
                          for p in present_names]
    del graph.output[:]
    graph.output.extend(outputs)
    if not any(o.domain == OGA for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(OGA, 1))
    return model


def _remove_dead_nodes(graph):
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(list(graph.node)):
        if any(out in needed for out in node.output if out):
            keep.append(node)
            needed.update(x for x in node.input if x)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    used = {x for n in graph.node for x in n.input}
    alive = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(alive)


def convert_config(config: dict, *, block_size: int, num_blocks: int | None, max_batch_size: int,
                   max_scheduled_tokens: int, context_length: int | None, rope_positions: int | None) -> dict:
    """genai_config.json of the converted directory."""
    config = json.loads(json.dumps(config))
    model, search = config["model"], config.setdefault("search", {})
    decoder = model["decoder"]
    layers = int(decoder["num_hidden_layers"])
    length = int(context_length or min(int(search.get("max_length", model.get("context_length", 4096))),
                                       cfg.CPU_DEFAULT_CONTEXT))
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
    decoder["state_groups"] = [{"kind": "paged_kv", "layer_ids": list(range(layers))}]
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
            progress: bool = False) -> str:
    """Converts OGA builder CPU directory `src` into a paged decoder directory `dst` (which must not
    exist yet) and returns dst. Raises ConversionError, writing nothing, when src cannot be
    converted. `context_length` (default: search.max_length capped at 4096) bounds each request;
    `num_blocks` defaults to `max_batch_size` requests of that length."""
    import onnx

    src, dst = os.fspath(src), os.fspath(dst)
    for name, value in (("block_size", block_size), ("max_batch_size", max_batch_size),
                        ("max_scheduled_tokens", max_scheduled_tokens)):
        if int(value) <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if num_blocks is not None and int(num_blocks) <= 0:
        raise ValueError(f"num_blocks must be > 0, got {num_blocks}")
    if context_length is not None and int(context_length) <= 0:
        raise ValueError(f"context_length must be > 0, got {context_length}")
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
    model = convert_graph(model, decoder, block_size=block_size, name=filename)
    cos_names = {n.input[PAGED_COS] for n in model.graph.node
                 if n.op_type == "PagedGroupQueryAttention" and len(n.input) > PAGED_COS}
    rope = [t for t in model.graph.initializer if t.name in cos_names]
    rope_positions = int(rope[0].dims[0]) if rope else None
    converted = convert_config(config, block_size=block_size, num_blocks=num_blocks, max_batch_size=max_batch_size,
                               max_scheduled_tokens=max_scheduled_tokens, context_length=context_length,
                               rope_positions=rope_positions)

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
        print(f"[oga.models] converted {src} -> {dst}: {layers_text(decoder)}", flush=True)
    return dst


def layers_text(decoder: dict) -> str:
    return (f"{decoder['num_hidden_layers']} layers of oga.PagedGroupQueryAttention "
            f"({decoder['num_attention_heads']}/{decoder['num_key_value_heads']} heads, head size {decoder['head_size']})")
