"""A paged decoder of the geometry of onnxruntime-genai's own synthetic engine test model
(test/models/engine/synthetic-paged: vocab 64, one layer, one KV head of width 1, float caches
[128, 4, 1, 1], float16 logits [batch_size, 64] of each row's last token, block size 4, 128 blocks,
batch 8), so that a step costs almost nothing in ONNX Runtime and a decode step measures the
engine, its binding and its executor.

The graph (standard ONNX ops, which both oga and onnxruntime-genai 0.18 run): each row's last packed
token t = input_ids[cumulative_sequence_lengths[r + 1] - 1] picks logits row t of a fixed table
whose largest entry is (7 t + 3) mod 64; the caches pass through unchanged (bound in place, so
nothing moves)."""
import json
import os

import numpy as np

VOCAB, BLOCK_SIZE, NUM_BLOCKS, MAX_BATCH = 64, 4, 128, 8


def _graph():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    info = helper.make_tensor_value_info
    cache = [NUM_BLOCKS, BLOCK_SIZE, 1, 1]
    inputs = [info("input_ids", TensorProto.INT64, ["num_tokens"]),
              info("cumulative_sequence_lengths", TensorProto.INT32, ["batch_size + 1"]),
              info("past_sequence_lengths", TensorProto.INT32, ["batch_size"]),
              info("block_table", TensorProto.INT32, ["batch_size", "max_blocks"]),
              info("attention_metadata", TensorProto.INT32, [3]),
              info("past_key_values.0.key", TensorProto.FLOAT, cache),
              info("past_key_values.0.value", TensorProto.FLOAT, cache)]
    outputs = [info("logits", TensorProto.FLOAT16, ["batch_size", VOCAB]),
               info("present.0.key", TensorProto.FLOAT, cache),
               info("present.0.value", TensorProto.FLOAT, cache)]
    table = np.full((VOCAB, VOCAB), -4.0, dtype=np.float16)
    for token in range(VOCAB):
        table[token] += np.linspace(0.0, 1.0, VOCAB, dtype=np.float16)  # distinct runner-up logits
        table[token, (7 * token + 3) % VOCAB] = 8.0
    initializers = [numpy_helper.from_array(table, "table"),
                    numpy_helper.from_array(np.array([1], np.int64), "one64"),
                    numpy_helper.from_array(np.array([2 ** 31 - 1], np.int64), "end"),
                    numpy_helper.from_array(np.array(1, np.int32), "one32")]
    nodes = [helper.make_node("Slice", ["cumulative_sequence_lengths", "one64", "end"], ["ends"]),
             helper.make_node("Sub", ["ends", "one32"], ["last"]),
             helper.make_node("Gather", ["input_ids", "last"], ["tokens"]),
             helper.make_node("Gather", ["table", "tokens"], ["logits"]),
             helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"]),
             helper.make_node("Identity", ["past_key_values.0.value"], ["present.0.value"])]
    graph = helper.make_graph(nodes, "synthetic-paged", inputs, outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _config():
    return {
        "model": {
            "bos_token_id": 0, "context_length": 128, "eos_token_id": [1], "pad_token_id": 0, "type": "llama",
            "vocab_size": VOCAB,
            "decoder": {
                "filename": "decoder.onnx", "head_size": 1, "hidden_size": 1, "num_attention_heads": 1,
                "num_hidden_layers": 1, "num_key_value_heads": 1,
                "session_options": {"log_id": "synthetic-paged", "provider_options": []},
                "inputs": {"input_ids": "input_ids", "cumulative_sequence_lengths": "cumulative_sequence_lengths",
                           "past_sequence_lengths": "past_sequence_lengths", "block_table": "block_table",
                           "attention_metadata": "attention_metadata", "past_key_names": "past_key_values.%d.key",
                           "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "state_groups": [{"kind": "paged_kv", "layer_ids": [0]}],
            },
        },
        "search": {"max_length": 128, "do_sample": False},
        "engine": {"dynamic_batching": {"block_size": BLOCK_SIZE, "num_blocks": NUM_BLOCKS,
                                        "max_batch_size": MAX_BATCH}},
    }


def build_synthetic_paged(directory):
    """Writes the model directory (genai_config.json, decoder.onnx) once; returns its path."""
    import onnx

    if not os.path.exists(os.path.join(directory, "genai_config.json")):
        os.makedirs(directory, exist_ok=True)
        onnx.save(_graph(), os.path.join(directory, "decoder.onnx"))
        with open(os.path.join(directory, "genai_config.json"), "w", encoding="utf-8") as f:
            json.dump(_config(), f, indent=2)
    return directory
