"""llama.cpp as a benchmark peer, through llama-cpp-python's low-level API (the `bench` extra:
`pip install 'oga[bench]'` compiles llama.cpp from source, ~10 minutes here, so it stays out of CI).

`run_llama_cpp(gguf, prompts, new_tokens)` decodes every prompt concurrently in one context, one
sequence per prompt (llama.cpp's own continuous batching: every step one llama_decode of all
sequences' next tokens), greedy on the host with EOS masked so every sequence makes exactly
`new_tokens` tokens, as the oga and onnxruntime-genai runs of the same workload do. Prompts are token
ids (the same ids the other engines get)."""
from __future__ import annotations

import time

import numpy as np


def available() -> bool:
    import importlib.util
    return importlib.util.find_spec("llama_cpp") is not None


def _call(module, names, *args):
    """The first of `names` that this llama-cpp-python exports (names moved between releases)."""
    for name in names:
        function = getattr(module, name, None)
        if function is not None:
            return function(*args)
    raise AttributeError(f"llama_cpp has none of {names}")


def run_llama_cpp(gguf_path, prompts, new_tokens, threads=None, batch=512):
    """Returns (generated tokens, seconds, time to first token per prompt, token streams)."""
    import os

    import llama_cpp as lc

    threads = threads or os.cpu_count() or 1
    lc.llama_backend_init()
    model_params = lc.llama_model_default_params()
    model = _call(lc, ["llama_model_load_from_file", "llama_load_model_from_file"], gguf_path.encode(), model_params)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = _call(lc, ["llama_vocab_n_tokens", "llama_n_vocab"], vocab)
    eos = lc.llama_vocab_eos(vocab)
    total = sum(len(p) for p in prompts) + len(prompts) * (new_tokens + 1)
    context_params = lc.llama_context_default_params()
    context_params.n_ctx = int(total + 256)
    context_params.n_batch = batch
    context_params.n_ubatch = batch
    context_params.n_seq_max = len(prompts)
    context_params.n_threads = threads
    context_params.n_threads_batch = threads
    context = _call(lc, ["llama_init_from_model", "llama_new_context_with_model"], model, context_params)
    tokens_max = max(batch, len(prompts))
    llama_batch = lc.llama_batch_init(tokens_max, 0, len(prompts))
    try:
        return _decode(lc, context, llama_batch, prompts, new_tokens, n_vocab, eos, batch)
    finally:
        lc.llama_batch_free(llama_batch)
        lc.llama_free(context)
        _call(lc, ["llama_model_free", "llama_free_model"], model)


def _decode(lc, context, llama_batch, prompts, new_tokens, n_vocab, eos, batch):
    positions = [0] * len(prompts)
    streams = [[] for _ in prompts]
    first_token_at = [None] * len(prompts)

    def submit(entries):
        """entries: [(sequence, token, wants logits)], in order; returns {sequence: batch index} of logits."""
        out = {}
        llama_batch.n_tokens = len(entries)
        for i, (seq, token, logits) in enumerate(entries):
            llama_batch.token[i] = int(token)
            llama_batch.pos[i] = positions[seq]
            llama_batch.n_seq_id[i] = 1
            llama_batch.seq_id[i][0] = seq
            llama_batch.logits[i] = bool(logits)
            positions[seq] += 1
            if logits:
                out[seq] = i
        status = lc.llama_decode(context, llama_batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status})")
        return out

    def pick(index):
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(context, index), shape=(n_vocab,)).copy()
        logits[eos] = -np.inf                                  # EOS masked: every sequence runs to new_tokens
        return int(np.argmax(logits))

    start = time.perf_counter()
    pending = [(seq, token, j == len(p) - 1) for seq, p in enumerate(prompts) for j, token in enumerate(p)]
    chosen = {}
    for at in range(0, len(pending), batch):                 # prefill in batches of `batch` tokens
        logits_rows = submit(pending[at:at + batch])
        for seq, index in logits_rows.items():
            chosen[seq] = pick(index)
            first_token_at[seq] = time.perf_counter() - start
    for step in range(new_tokens):
        for seq, token in chosen.items():
            streams[seq].append(token)
        if step == new_tokens - 1:
            break
        logits_rows = submit([(seq, chosen[seq], True) for seq in range(len(prompts))])
        chosen = {seq: pick(index) for seq, index in logits_rows.items()}
    seconds = time.perf_counter() - start
    return sum(len(s) for s in streams), seconds, first_token_at, streams
