"""Test helpers over oga's OgaExt C functions: the built-in deterministic test model, fault
injection and engine introspection. Pure Python; each helper is one call into oga._core."""
import json

from . import _core

__all__ = [
    "check_invariants",
    "create_test_model",
    "engine_counters",
    "inject_fault",
    "last_step_inputs",
    "set_last_turn_id",
    "set_token_table",
]

# OgaExtFaultPhase values.
FAULT_PHASES = {
    "plan": 0,
    "reserve": 1,
    "execute": 2,
    "sample": 3,
    "commit_prepare": 4,
    "commit": 5,
}
# OgaExtExecutionStatus values an armed "execute" fault reports.
FAULT_KINDS = {
    "retryable": 1,
    "capacity": 2,
    "fatal": 3,
}


def create_test_model(
    *,
    vocab_size=64,
    eos_token_id=1,
    bos_token_id=0,
    pad_token_id=0,
    context_length=128,
    max_length=None,
    block_size=4,
    num_blocks=128,
    max_batch_size=8,
    max_scheduled_tokens=None,
    chunk_size=None,
    per_token_logits=False,
    max_block_table_columns=0,
    prefix_caching=False,
    sliding_window=None,
    search=None,
):
    """Builds a genai_config document for the built-in test executor and creates the model
    (OgaExtCreateTestModel). ``eos_token_id`` may be an int or a list; ``num_blocks=None``,
    ``max_scheduled_tokens=None`` and ``chunk_size=None`` omit their keys; ``search`` entries
    override the search section. ``prefix_caching`` is written as engine.dynamic_batching.prefix_caching
    (default False, so usage counts stay independent of earlier requests); None omits the key, which
    means on, as in onnxruntime-genai 0.18. ``sliding_window=(window_size, layers)`` makes a 2-layer
    decoder whose ``layers`` keep a sliding-window ring (needs ``chunk_size``), which the test executor
    checks position by position."""
    search_section = {"max_length": max_length or context_length, "do_sample": False}
    if chunk_size is not None:
        search_section["chunk_size"] = chunk_size
    search_section.update(search or {})
    dynamic_batching = {"block_size": block_size, "max_batch_size": max_batch_size}
    if num_blocks is not None:
        dynamic_batching["num_blocks"] = num_blocks
    if max_scheduled_tokens is not None:
        dynamic_batching["max_scheduled_tokens"] = max_scheduled_tokens
    if prefix_caching is not None:
        dynamic_batching["prefix_caching"] = bool(prefix_caching)
    config = {
        "model": {
            "type": "oga_test",
            "vocab_size": vocab_size,
            "context_length": context_length,
            "eos_token_id": list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else eos_token_id,
            "bos_token_id": bos_token_id,
            "pad_token_id": pad_token_id,
            "decoder": {},
        },
        "search": search_section,
        "engine": {"dynamic_batching": dynamic_batching},
        "test_model": {
            "per_token_logits": bool(per_token_logits),
            "max_block_table_columns": max_block_table_columns,
        },
    }
    if sliding_window is not None:
        # (window_size, ring layers of a 2-layer decoder): the executor checks the engine's ring.
        window_size, layers = sliding_window
        config["model"]["decoder"] = {"num_hidden_layers": 2,
                                      "sliding_window": {"window_size": window_size, "layers": list(layers)}}
        config["test_model"]["windowed_block_table"] = True
    return _core._test_model_create(json.dumps(config))


def inject_fault(model, phase, kind="retryable", skip=0, count=1):
    """Arms a fault on a test model (OgaExtTestModelInjectFault): the next ``skip`` consultations
    of ``phase`` pass, then ``count`` fail. ``kind`` only matters for phase "execute"."""
    try:
        phase_value = FAULT_PHASES[phase]
    except KeyError:
        raise ValueError(f"Unknown fault phase {phase!r}; expected one of {sorted(FAULT_PHASES)}.") from None
    try:
        kind_value = FAULT_KINDS[kind]
    except KeyError:
        raise ValueError(f"Unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}.") from None
    _core._test_model_inject_fault(model, phase_value, kind_value, skip, count)


def check_invariants(engine):
    """OgaExtEngineCheckInvariants: raises RuntimeError listing every violated invariant."""
    _core._engine_check_invariants(engine)


def engine_counters(engine):
    """OgaExtEngineGetCounters as a dict."""
    return _core._engine_counters(engine)


def last_step_inputs(engine):
    """OgaExtEngineGetLastStepInputs: numpy copies of the last packed step (block_table is 2-D)."""
    return _core._engine_last_step_inputs(engine)


def set_last_turn_id(request, turn_id):
    """OgaExtRequestSetLastTurnIdForTesting."""
    _core._request_set_last_turn_id(request, turn_id)


def set_token_table(model, tokens, *, special=()):
    """OgaExtModelSetTokenTable: the text of each token id, for stop strings and guidance on models
    without a tokenizer.json (test models). ``tokens[i]`` is token i's exact bytes (``bytes``, or a
    ``str`` taken as UTF-8); ids in ``special`` are special tokens (no text)."""
    import numpy as np

    pieces = [t.encode("utf-8") if isinstance(t, str) else bytes(t) for t in tokens]
    offsets = np.zeros(len(pieces) + 1, dtype=np.uintp)
    np.cumsum([len(p) for p in pieces], out=offsets[1:])
    flags = np.zeros(len(pieces), dtype=np.uint8)
    for token_id in special:
        flags[token_id] = 1
    _core._model_set_token_table(model, b"".join(pieces), offsets, flags)
