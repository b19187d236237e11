"""One decoder step timed directly through ONNX Runtime (no engine around it), at a given batch and
context: for a paged decoder (oga's contract: packed tokens, block table, caches bound in place) and
for onnxruntime-genai's contiguous-cache CPU graph (GroupQueryAttention with past and present
sharing one buffer of the maximum length, as 0.18's static engine binds them). Session options are
ONNX Runtime's defaults (intra-op threads: the physical cores), oga's operators registered."""
from __future__ import annotations

import json
import os
import time

import numpy as np


def _config(model_dir):
    with open(os.path.join(model_dir, "genai_config.json"), encoding="utf-8") as f:
        return json.load(f)


def _session(model_dir):
    import onnxruntime as ort

    from oga import ortops

    config = _config(model_dir)
    options = ort.SessionOptions()
    ortops.register(options)
    path = os.path.join(model_dir, config["model"]["decoder"]["filename"])
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]), config


def _cache_dtype(session, name):
    kind = next(i.type for i in session.get_inputs() if i.name == name)
    return np.float16 if kind == "tensor(float16)" else np.float32


def _timed(session, binding, reps):
    session.run_with_iobinding(binding)                        # warm: prepacking, arenas
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def paged_decode_ms(model_dir, batch, context, reps=10, query=1, block_size=None):
    """Median ms of one step of `batch` rows with `context` cached positions each and `query` new
    tokens per row (1: decode), caches of exactly the blocks the rows need, scattered."""
    session, config = _session(model_dir)
    decoder = config["model"]["decoder"]
    block_size = block_size or config["engine"]["dynamic_batching"]["block_size"]
    layers, kv_heads, head_dim = decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]
    per_row = -(-(context + query) // block_size)
    blocks = batch * per_row
    rng = np.random.default_rng(0)
    binding = session.io_binding()
    dtype = _cache_dtype(session, "past_key_values.0.key")
    keep = []
    for i in range(layers):
        for kind in ("key", "value"):
            cache = np.zeros((blocks, block_size, kv_heads, head_dim), dtype)
            keep.append(cache)
            binding.bind_cpu_input(f"past_key_values.{i}.{kind}", cache)
            binding.bind_output(f"present.{i}.{kind}", "cpu", 0, dtype, list(cache.shape), cache.ctypes.data)
    tokens = batch * query
    feeds = {"input_ids": rng.integers(3, 1000, tokens).astype(np.int64),
             "cumulative_sequence_lengths": np.arange(0, tokens + 1, query, dtype=np.int32),
             "past_sequence_lengths": np.full(batch, context, np.int32),
             "block_table": rng.permutation(blocks).astype(np.int32).reshape(batch, per_row),
             "attention_metadata": np.array([query, context + query, context + query], np.int32)}
    for name, array in feeds.items():
        keep.append(array)
        binding.bind_cpu_input(name, array)
    logits = np.zeros((batch, config["model"]["vocab_size"]), np.float32)
    binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    return _timed(session, binding, reps)


def contiguous_decode_ms(model_dir, batch, context, max_length, reps=10):
    """Median ms of one decode step of onnxruntime-genai's contiguous-cache graph: `batch` rows with
    `context` cached positions, past and present bound to one [batch, kv_heads, max_length, head]
    buffer per layer (past_present_share_buffer)."""
    session, config = _session(model_dir)
    decoder = config["model"]["decoder"]
    layers, kv_heads, head_dim = decoder["num_hidden_layers"], decoder["num_key_value_heads"], decoder["head_size"]
    rng = np.random.default_rng(0)
    binding = session.io_binding()
    keep = []
    for i in range(layers):
        for kind in ("key", "value"):
            cache = np.zeros((batch, kv_heads, max_length, head_dim), np.float32)
            keep.append(cache)
            binding.bind_cpu_input(f"past_key_values.{i}.{kind}", cache)
            binding.bind_output(f"present.{i}.{kind}", "cpu", 0, np.float32, list(cache.shape), cache.ctypes.data)
    ids = rng.integers(3, 1000, (batch, 1)).astype(np.int64)
    mask = np.ones((batch, context + 1), np.int64)
    keep += [ids, mask]
    binding.bind_cpu_input("input_ids", ids)
    binding.bind_cpu_input("attention_mask", mask)
    logits = np.zeros((batch, 1, config["model"]["vocab_size"]), np.float32)
    binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    return _timed(session, binding, reps)
