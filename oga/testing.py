"""Test helpers over oga's OgaExt C functions: the built-in deterministic test model, fault
injection and engine introspection. Pure Python; each helper is one call into oga._core (except
device_path, which switches the ONNX Runtime executor's device path onto the CPU)."""
import contextlib
import json

from . import _core
from .introspection import decoder_names, engine_counters  # noqa: F401  (tests read them here too)

__all__ = [
    "check_invariants",
    "create_test_model",
    "device_path",
    "engine_counters",
    "fixed_state_row",
    "fixed_state_slot",
    "inject_fault",
    "last_step_inputs",
    "set_fixed_state_fallback_only",
    "set_last_turn_id",
    "set_token_table",
]

# OgaExtFaultPhase values.
FAULT_PHASES = {phase.name.lower(): int(phase) for phase in _core.FaultPhase}
# OgaExtExecutionStatus values an armed "execute" fault reports.
FAULT_KINDS = {"retryable": int(_core.ExecutionStatus.RETRYABLE),
               "capacity": int(_core.ExecutionStatus.CAPACITY_EXCEEDED),
               "fatal": int(_core.ExecutionStatus.FATAL),
               "interrupted": int(_core.ExecutionStatus.INTERRUPTED)}


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
    preemption=None,
    sliding_window=None,
    hybrid=None,
    fixed_state_row_words=2,
    fixed_state_capture=False,
    cuda_graph=False,
    device_ops=False,
    device_logits=False,
    device_sampling=True,
    search=None,
):
    """Builds a genai_config document for the built-in test executor and creates the model
    (OgaExtCreateTestModel). ``eos_token_id`` may be an int or a list; ``num_blocks=None``,
    ``max_scheduled_tokens=None`` and ``chunk_size=None`` omit their keys; ``search`` entries
    override the search section. ``prefix_caching`` is written as engine.dynamic_batching.prefix_caching
    (default False, so usage counts stay independent of earlier requests); None omits the key, which
    means on, as in onnxruntime-genai 0.18. ``preemption`` ("recompute" or "none") is written as
    engine.dynamic_batching.preemption; None omits the key (recompute, the engine's default).
    ``sliding_window=(window_size, layers)`` makes a 2-layer
    decoder whose ``layers`` keep a sliding-window ring (needs ``chunk_size``), which the test executor
    checks position by position. ``hybrid=(paged, conv, recurrent)`` (three lists of layer ids of a
    decoder with max(all) + 1 layers) declares model.decoder.state_groups with a paged_kv group and
    fixed_conv / fixed_recurrent groups (empty ones omitted): the test executor then keeps one fixed
    state tensor per fixed layer, rows of ``fixed_state_row_words`` 8-byte words, checks every row's
    fixed input against its token history and, with ``fixed_state_capture``, captures every packed
    token's state (needed to verify drafts on a hybrid model). ``cuda_graph`` declares the CUDA graph
    capability: pure-decode steps then come bucketed with a graph id, which the executor checks.
    ``device_ops`` puts the engine's fixed-state memory on a simulated device (fault phase
    "device_copy" fails its copies). ``device_logits`` (with ``device_ops``) leaves every step's logits
    on that device (OgaExtStepOutputs.logits_on_device), stored encoded so an engine that read them
    directly would select wrong tokens: the engine must read rows back through the device's `read`
    or select through its `sample` (the host sampler's code; fault phase "device_sample" fails it);
    ``device_sampling=False`` leaves `sample` out."""
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
    if preemption is not None:
        dynamic_batching["preemption"] = preemption
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
            "cuda_graph": bool(cuda_graph),
            "device_ops": bool(device_ops),
            "device_logits": bool(device_logits),
            "device_sampling": bool(device_sampling),
        },
    }
    if sliding_window is not None:
        # (window_size, ring layers of a 2-layer decoder): the executor checks the engine's ring.
        window_size, layers = sliding_window
        config["model"]["decoder"] = {"num_hidden_layers": 2,
                                      "sliding_window": {"window_size": window_size, "layers": list(layers)}}
        config["test_model"]["windowed_block_table"] = True
    if hybrid is not None:
        paged, conv, recurrent = (list(layers) for layers in hybrid)
        groups = [{"kind": "paged_kv", "layer_ids": paged}]
        groups += [{"kind": kind, "layer_ids": layers}
                   for kind, layers in (("fixed_conv", conv), ("fixed_recurrent", recurrent)) if layers]
        config["model"]["decoder"]["num_hidden_layers"] = max(paged + conv + recurrent) + 1
        config["model"]["decoder"]["state_groups"] = groups
        config["test_model"]["fixed_state_row_words"] = fixed_state_row_words
        config["test_model"]["fixed_state_capture"] = bool(fixed_state_capture)
    return _core._test_model_create(json.dumps(config))


def inject_fault(model, phase, kind="retryable", skip=0, count=1):
    """Arms a fault on a test model (OgaExtTestModelInjectFault): the next ``skip`` consultations
    of ``phase`` pass, then ``count`` fail. ``kind`` matters for phase "execute" (the status the
    executor reports) and, as "interrupted", for the device and fixed-state phases (an
    interruption instead of a failure; see OgaExtExecutionStatus_Interrupted)."""
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


def last_step_inputs(engine):
    """OgaExtEngineGetLastStepInputs: numpy copies of the last packed step (block_table is 2-D)."""
    return _core._engine_last_step_inputs(engine)


def fixed_state_slot(request):
    """OgaExtRequestGetFixedStateSlot as a dict: slot (-1 = none), active_bank,
    allocation_generation, state_generation, committed_tokens."""
    return _core._request_fixed_state_slot(request)


def fixed_state_row(request, tensor):
    """OgaExtRequestGetFixedStateRow: a bytes copy of the request's committed row of fixed tensor
    ``tensor`` (hybrid models)."""
    return _core._request_fixed_state_row(request, tensor)


def set_fixed_state_fallback_only(engine, fallback_only=True):
    """OgaExtEngineSetFixedStateFallbackOnly: always gather / stage fixed state (benchmarks)."""
    _core._engine_set_fixed_state_fallback_only(engine, fallback_only)


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


@contextlib.contextmanager
def device_path(factory=None):
    """Test-only: models loaded (og.Model) inside the block whose ONNX session runs on the CPU
    provider take the ONNX Runtime executor's device path -- caches, staged inputs and logits in
    memory of ``factory()`` (default ``oga.device.HostDevice``, ONNX Runtime device type "cpu") --
    instead of the host path, so the CUDA path's code runs on CPU. Such a model keeps its device
    after the block ends; engines opened on it later use it too. A cuda entry in the config's
    provider_options with enable_cuda_graph declares CUDA graphs on this path as on CUDA (the CPU
    provider ignores the gpu_graph_id run option). Yields nothing."""
    from . import executor
    from .device import HostDevice

    previous = executor.set_cpu_device_factory(factory or HostDevice)
    try:
        yield
    finally:
        executor.set_cpu_device_factory(previous)
