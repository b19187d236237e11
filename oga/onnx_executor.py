"""The ONNX Runtime model executor: runs a paged decoder for the engine core.

The core hands every step over as packed buffers it owns (see OgaExtStepInputs in
include/oga/oga_ext.h). This module binds those buffers to the session by address through
IOBinding, so nothing is copied on the way in; the KV caches are allocated once per engine,
zeroed, and bound as both the cache input and the cache output of every layer, so ONNX Runtime
updates them in place (the graph must produce each present cache straight out of ScatterND). The
logits land in a buffer allocated once at the configured row limit.

Sliding-window ring layers: when the graph takes `block_table_windowed`, the layers named by
model.decoder.sliding_window keep their KV in a ring; their caches are
[window_blocks, block_size, kv_heads, head_size] (window_blocks from the engine geometry), bound
the same way, and every step binds the engine's windowed block table next to the full one.

Fixed decoder state (hybrid models, reference E.5): model.decoder.state_groups may list
fixed_conv / fixed_recurrent groups beside the paged_kv group. OnnxDecoder expands their
templates (model.decoder.inputs past_conv_names / past_recurrent_names, outputs present_conv_names /
present_recurrent_names, OGA's defaults when absent), validates every input/output pair (both
present, one dtype, identical statically known per-row geometry, a dynamic batch axis 0) and
exposes them as `fixed_states` (FixedStateTensor, in group then layer order). The engine owns the
state memory: OnnxEngineExecutor.execute takes `fixed_state`, one (input address, output address)
pair per fixed tensor, each [num_rows, *row_shape] contiguous, and binds them by address.

Per-token fixed state capture (draft verification): when only a prefix of a row's draft tokens is
accepted, the engine must commit the state after the last accepted token, not the one after the
row's last packed token. oga's convention: a decoder may give every fixed state output X a
companion output named X + ".per_token" (e.g. present.0.conv_state.per_token) of X's dtype and
shape [num_tokens, *row_shape], row i holding the state of token i's row after token i. OnnxDecoder
accepts it only for every fixed tensor or none (ModelLoadError otherwise), records the name as
FixedStateTensor.capture_name and sets `fixed_state_capture`; execute's `fixed_state` entries are
then (input, output, capture) address triples, the capture [num_tokens, *row_shape] contiguous
memory overlapping neither the input nor the output.

The Cython trampolines in _core.pyx call `load_decoder` (at OgaCreateModel) and the methods of
`OnnxDecoder` / `OnnxEngineExecutor` (at engine creation and at every step).
"""
import ctypes
import dataclasses
import json
import os
import time
import weakref
from dataclasses import dataclass

import numpy as np

# OgaExtExecutionStatus
STATUS_OK = 0
STATUS_CAPACITY_EXCEEDED = 2
STATUS_FATAL = 3
# OgaExtLogitsType
LOGITS_FLOAT32 = 0
LOGITS_FLOAT16 = 1

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}
_CACHE_TYPES = ("tensor(float)", "tensor(float16)")
# Fragments of ONNX Runtime's allocation failures: the step is rolled back and the engine stays
# healthy (ExecutionCapacityExceeded); every other failure is fatal.
_OUT_OF_MEMORY_MARKERS = ("bad_alloc", "failed to allocate memory", "out of memory", "cudaerrormemoryallocation")


class ModelLoadError(RuntimeError):
    pass


# fixed state output X -> X + CAPTURE_SUFFIX: its per-token capture output (see the module docstring)
CAPTURE_SUFFIX = ".per_token"

# kind -> (inputs key, OGA's default input template, outputs key, default output template)
FIXED_STATE_KINDS = {
    "fixed_conv": ("past_conv_names", "past_key_values.%d.conv_state", "present_conv_names", "present.%d.conv_state"),
    "fixed_recurrent": ("past_recurrent_names", "past_key_values.%d.recurrent_state", "present_recurrent_names",
                        "present.%d.recurrent_state"),
}


@dataclass(frozen=True)
class FixedStateTensor:
    """One validated fixed-state binding: per request row, `row_shape` elements of `dtype`."""
    kind: str                 # "fixed_conv" | "fixed_recurrent"
    layer: int                # logical layer id
    input_name: str           # graph input (the committed state of each row)
    output_name: str          # graph output (the state after the row's last packed token)
    dtype: type               # numpy scalar type
    row_shape: tuple          # static non-batch dimensions
    row_bytes: int            # bytes of one row
    capture_name: str | None = None   # graph output of the state after every packed token
                                      # ([num_tokens, *row_shape]), None when the decoder has none


def classify_failure(error):
    """Maps an ONNX Runtime exception to an OgaExtExecutionStatus."""
    text = str(error).lower()
    if isinstance(error, MemoryError) or any(marker in text for marker in _OUT_OF_MEMORY_MARKERS):
        return STATUS_CAPACITY_EXCEEDED
    return STATUS_FATAL


def _provider_list(session_options_config):
    """(providers, provider_options) for InferenceSession from genai_config's session_options."""
    providers, options = [], []
    aliases = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider", "dml": "DmlExecutionProvider",
               "rocm": "ROCMExecutionProvider", "webgpu": "WebGpuExecutionProvider"}
    for entry in session_options_config.get("provider_options", []) or []:
        for name, values in entry.items():
            provider = aliases.get(name.lower(), name)
            providers.append(provider)
            options.append({str(k): str(v) for k, v in (values or {}).items()})
    providers.append("CPUExecutionProvider")
    options.append({})
    return providers, options


def cuda_unavailable_reason(ort):
    """Why ONNX Runtime cannot run a session on CUDA here, or "" when it may."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return ("this onnxruntime package has no CUDAExecutionProvider (install oga's gpu extra, which brings "
                "onnxruntime-gpu; see the README's Set-up)")
    try:
        from . import cuda_kernels
    except ImportError:
        return ""
    available, reason = cuda_kernels.cuda_status()
    return "" if available else reason


class OnnxDecoder:
    """Model-level state: the session and the validated graph signature."""

    def __init__(self, names):
        import onnxruntime as ort

        self.names = names
        config = json.loads(names["config_json"])
        decoder_config = config.get("model", {}).get("decoder", {})
        self.decoder_config = decoder_config
        self.path = os.path.join(names["model_directory"], names["decoder_filename"])
        if not os.path.isfile(self.path):
            raise ModelLoadError(f"The decoder file {self.path} does not exist (model.decoder.filename).")
        options = ort.SessionOptions()
        # ONNX Runtime's intra-op threads spin-wait after a run by default, holding the cores the
        # engine's token selection (RowWorkers) needs right then; they still spin inside a run.
        options.add_session_config_entry("session.force_spinning_stop", "1")
        session_config = decoder_config.get("session_options", {}) or {}
        if "log_id" in session_config:
            options.logid = str(session_config["log_id"])
        if "intra_op_num_threads" in session_config:
            options.intra_op_num_threads = int(session_config["intra_op_num_threads"])
        if "inter_op_num_threads" in session_config:
            options.inter_op_num_threads = int(session_config["inter_op_num_threads"])
        providers, provider_options = _provider_list(session_config)
        available = set(ort.get_available_providers())
        # CUDA only where the session really can run on it: a provider ONNX Runtime has and a device.
        wants_cuda = "CUDAExecutionProvider" in providers
        cuda_reason = cuda_unavailable_reason(ort) if wants_cuda else ""
        chosen = [(p, o) for p, o in zip(providers, provider_options)
                  if p in available and not (p == "CUDAExecutionProvider" and cuda_reason)]
        try:
            self.session = ort.InferenceSession(
                self.path, options, providers=[p for p, _ in chosen], provider_options=[o for _, o in chosen])
        except Exception as error:
            if cuda_reason and ("PagedAttention" in str(error) or "NOT_IMPLEMENTED" in str(error)):
                raise ModelLoadError(
                    f"{self.path}: this decoder needs CUDA (com.microsoft.PagedAttention has no CPU kernel in ONNX "
                    f"Runtime), and CUDA is not available: {cuda_reason}.") from error
            raise
        self.providers = self.session.get_providers()
        if wants_cuda and cuda_reason:
            import warnings

            warnings.warn(f"{self.path}: genai_config.json asks for CUDA; running on CPU because {cuda_reason}.",
                          RuntimeWarning, stacklevel=2)
        if self.providers and self.providers[0] == "CUDAExecutionProvider":
            # Not yet: this executor binds its caches and packed inputs in host memory.
            raise ModelLoadError(
                f"{self.path}: the session runs on CUDAExecutionProvider, but oga's ONNX Runtime executor does not "
                "support CUDA yet (its KV caches and inputs live in host memory). Remove the cuda entry of "
                "model.decoder.session_options.provider_options to run the model on CPU.")
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = {o.name: o for o in self.session.get_outputs()}
        self._validate()

    # -- validation -----------------------------------------------------------------------------
    def _fail(self, tensor, expected, actual):
        raise ModelLoadError(f"{self.path}: tensor '{tensor}' {actual}; expected {expected}.")

    def _check(self, table, name, types, rank, kind):
        meta = table.get(name)
        if meta is None:
            raise ModelLoadError(f"{self.path}: the graph has no {kind} '{name}' (named by genai_config.json).")
        if meta.type not in types:
            self._fail(name, " or ".join(types), f"has type {meta.type}")
        if rank is not None and len(meta.shape) != rank:
            self._fail(name, f"rank {rank}", f"has shape {meta.shape}")
        return meta

    def _validate(self):
        n = self.names
        self.static = not n["block_size"]
        self.fixed_states = ()
        self.fixed_state_row_bytes = 0
        self.fixed_state_capture = False
        if self.static:
            if any(isinstance(g, dict) and g.get("kind") in FIXED_STATE_KINDS
                   for g in self.decoder_config.get("state_groups") or []):
                # As 0.18: the model loads, and og.Engine refuses ("Fixed decoder state groups require
                # engine.dynamic_batching") before it opens this decoder.
                self.per_token_logits = self.windowed_block_table = False
                self.ring_layers = frozenset()
                self.bytes_per_block = 0
                return
            self._validate_static()
            return
        self._check(self.inputs, n["input_ids"], ("tensor(int64)",), 1, "input")
        self._check(self.inputs, n["cumulative_sequence_lengths"], ("tensor(int32)",), 1, "input")
        self._check(self.inputs, n["past_sequence_lengths"], ("tensor(int32)",), 1, "input")
        self._check(self.inputs, n["block_table"], ("tensor(int32)",), 2, "input")
        self.has_position_ids = n["position_ids"] in self.inputs
        if self.has_position_ids:
            meta = self._check(self.inputs, n["position_ids"], ("tensor(int64)",), None, "input")
            if len(meta.shape) != 1:
                self._fail(n["position_ids"], "rank 1 ([num_tokens]); MRoPE positions are not supported yet",
                           f"has shape {meta.shape}")
        self.has_attention_metadata = n["attention_metadata"] in self.inputs
        if self.has_attention_metadata:
            meta = self._check(self.inputs, n["attention_metadata"], ("tensor(int32)",), 1, "input")
            if isinstance(meta.shape[0], int) and meta.shape[0] != 3:
                self._fail(n["attention_metadata"], "shape [3]", f"has shape {meta.shape}")
        self.has_logits_indices = bool(n["logits_indices"]) and n["logits_indices"] in self.inputs
        if n["logits_indices"] and not self.has_logits_indices:
            raise ModelLoadError(f"{self.path}: the graph has no input '{n['logits_indices']}' "
                                 "(model.decoder.inputs.logits_indices).")
        if self.has_logits_indices:
            self._check(self.inputs, n["logits_indices"], ("tensor(int32)",), 1, "input")
        self._validate_window()
        logits = self._check(self.outputs, n["logits"], ("tensor(float)", "tensor(float16)"), 2, "output")
        self.logits_dtype = _ORT_TYPES[logits.type]
        vocab = logits.shape[1]
        if isinstance(vocab, int) and vocab != n["vocab_size"]:
            self._fail(n["logits"], f"vocab dimension {n['vocab_size']} (model.vocab_size)", f"has shape {logits.shape}")
        # OGA's convention: a first logits dimension named batch_size means one row per request.
        self.per_token_logits = not self.has_logits_indices and logits.shape[0] != "batch_size"
        self._validate_caches()
        self._validate_fixed_states()

    def _validate_fixed_states(self):
        """The fixed_conv / fixed_recurrent groups of model.decoder.state_groups (reference E.5)."""
        config = self.decoder_config
        groups = config.get("state_groups") or []
        inputs_config = config.get("inputs", {}) or {}
        outputs_config = config.get("outputs", {}) or {}
        layers = config.get("num_hidden_layers")
        tensors = []
        for group in groups:
            kind = group.get("kind") if isinstance(group, dict) else None
            if kind == "paged_kv":
                continue
            if kind not in FIXED_STATE_KINDS:
                raise ModelLoadError(f"{self.path}: unknown model.decoder.state_groups kind {kind!r} (expected "
                                     "paged_kv, fixed_conv or fixed_recurrent).")
            in_key, in_default, out_key, out_default = FIXED_STATE_KINDS[kind]
            templates = []
            for section, key, default in (("inputs", in_key, in_default), ("outputs", out_key, out_default)):
                template = (inputs_config if section == "inputs" else outputs_config).get(key, default)
                if not isinstance(template, str) or template.count("%d") != 1 or template.count("%") != 1:
                    raise ModelLoadError(f"{self.path}: model.decoder.{section}.{key} {template!r} must contain "
                                         "exactly one %d (the layer id).")
                templates.append(template)
            for layer in group.get("layer_ids") or []:
                layer = int(layer)
                if isinstance(layers, int) and not 0 <= layer < layers:
                    raise ModelLoadError(f"{self.path}: {kind} layer {layer} is outside the decoder layers "
                                         f"[0, {layers}).")
                tensors.append(self._fixed_tensor(kind, layer, templates[0] % layer, templates[1] % layer))
        tensors = self._fixed_captures(tensors)
        seen = {}
        for t in tensors:
            for name in (t.input_name, t.output_name) + ((t.capture_name,) if t.capture_name else ()):
                if name in seen:
                    raise ModelLoadError(f"{self.path}: fixed state tensor '{name}' is named by two bindings "
                                         f"({seen[name]} and {t.kind} layer {t.layer}).")
                seen[name] = f"{t.kind} layer {t.layer}"
        self.fixed_states = tuple(tensors)
        self.fixed_state_row_bytes = sum(t.row_bytes for t in tensors)

    def _fixed_captures(self, tensors):
        """The per-token capture outputs (X.per_token beside each fixed output X): all validated and
        recorded in capture_name, or none; sets fixed_state_capture."""
        have = [t.output_name + CAPTURE_SUFFIX in self.outputs for t in tensors]
        if not any(have):
            return tensors
        if not all(have):
            missing = [t.output_name + CAPTURE_SUFFIX for t, h in zip(tensors, have) if not h]
            present = [t.output_name + CAPTURE_SUFFIX for t, h in zip(tensors, have) if h]
            raise ModelLoadError(f"{self.path}: the graph captures per-token fixed state for some tensors "
                                 f"({', '.join(present)}) but has no output {', '.join(repr(m) for m in missing)}; "
                                 "a decoder outputs the per-token state of every fixed tensor or of none.")
        captured = []
        for t in tensors:
            name = t.output_name + CAPTURE_SUFFIX
            out = self.outputs[name]
            input_type = self.inputs[t.input_name].type
            if out.type != input_type:
                self._fail(name, f"the type of '{t.output_name}' ({input_type})", f"has type {out.type}")
            dims = ", ".join(str(d) for d in t.row_shape)
            expected = f"[num_tokens, {dims}] (the per-token states of '{t.output_name}')"
            if len(out.shape) != 1 + len(t.row_shape):
                self._fail(name, expected, f"has shape {out.shape}")
            if isinstance(out.shape[0], int):
                self._fail(name, expected + " with a dynamic axis 0 (one row per packed token)",
                           f"has shape {out.shape}")
            if tuple(out.shape[1:]) != t.row_shape:
                self._fail(name, expected, f"has shape {out.shape}")
            captured.append(dataclasses.replace(t, capture_name=name))
        self.fixed_state_capture = True
        return captured

    def _fixed_tensor(self, kind, layer, input_name, output_name):
        where = f"{kind} layer {layer}"
        meta = self.inputs.get(input_name)
        if meta is None:
            raise ModelLoadError(f"{self.path}: the graph has no input '{input_name}' (the {where} state named by "
                                 "genai_config.json).")
        out = self.outputs.get(output_name)
        if out is None:
            raise ModelLoadError(f"{self.path}: the graph has no output '{output_name}' (the {where} state named by "
                                 "genai_config.json).")
        if meta.type not in _ORT_TYPES:
            self._fail(input_name, "a float, float16, int32 or int64 state", f"has type {meta.type}")
        if out.type != meta.type:
            self._fail(output_name, f"the type of '{input_name}' ({meta.type})", f"has type {out.type}")
        for name, shape in ((input_name, meta.shape), (output_name, out.shape)):
            if len(shape) < 2:
                self._fail(name, "[batch, state dims...] (rank 2 or more)", f"has shape {shape}")
            batch = shape[0]
            if isinstance(batch, int) and batch == 0:
                self._fail(name, "a non-zero batch axis 0", f"has shape {shape}")
            if isinstance(batch, int) and batch > 0:
                self._fail(name, "a dynamic batch axis 0 (one row per scheduled request)", f"has shape {shape}")
            if not all(isinstance(d, int) and d > 0 for d in shape[1:]):
                self._fail(name, "statically known positive non-batch dimensions", f"has shape {shape}")
        if tuple(out.shape[1:]) != tuple(meta.shape[1:]):
            self._fail(output_name, f"the per-row geometry of '{input_name}' {meta.shape}", f"has shape {out.shape}")
        dtype = _ORT_TYPES[meta.type]
        row_shape = tuple(int(d) for d in meta.shape[1:])
        return FixedStateTensor(kind=kind, layer=layer, input_name=input_name, output_name=output_name,
                                dtype=dtype, row_shape=row_shape,
                                row_bytes=int(np.prod(row_shape)) * np.dtype(dtype).itemsize)

    def _validate_window(self):
        """Sliding-window ring layers: the graph takes block_table_windowed, and the layers that
        model.decoder.sliding_window names keep their caches in the ring."""
        n = self.names
        name = n["block_table_windowed"]
        self.windowed_block_table = bool(name) and name in self.inputs
        self.ring_layers = frozenset()
        if not self.windowed_block_table:
            return  # sliding-window layers (if any) keep the full cache; the graph masks them
        self._check(self.inputs, name, ("tensor(int32)",), 2, "input")
        window = self.decoder_config.get("sliding_window") or {}
        layers = window.get("layers") if isinstance(window, dict) else None
        if not layers:
            raise ModelLoadError(f"{self.path}: the graph takes '{name}' (model.decoder.inputs.block_table_windowed), "
                                 "but model.decoder.sliding_window names no layers to keep in the ring.")
        paged = set(n["paged_layer_ids"])
        outside = sorted(set(layers) - paged)
        if outside:
            raise ModelLoadError(f"{self.path}: sliding-window layers {outside} are not paged_kv layers.")
        self.ring_layers = frozenset(int(i) for i in layers)
        if self.ring_layers >= paged:
            raise ModelLoadError(f"{self.path}: every paged layer is a sliding-window ring layer; a paged model "
                                 "needs at least one layer that keeps the whole sequence.")

    def _validate_caches(self):
        n = self.names
        geometry = None
        self.cache_dtype = None
        for layer, past_k, past_v, present_k, present_v in zip(
                n["paged_layer_ids"], n["past_key_names"], n["past_value_names"], n["present_key_names"],
                n["present_value_names"]):
            for past, present in ((past_k, present_k), (past_v, present_v)):
                meta = self._check(self.inputs, past, _CACHE_TYPES, 4, "input")
                out = self._check(self.outputs, present, (meta.type,), 4, "output")
                dims = tuple(meta.shape[1:])
                if not all(isinstance(d, int) and d > 0 for d in dims):
                    self._fail(past, "static [num_blocks, block_size, kv_heads, head_size] geometry",
                               f"has shape {meta.shape}")
                if dims[0] != n["block_size"]:
                    self._fail(past, f"block_size {n['block_size']} in dimension 1 (engine.dynamic_batching.block_size)",
                               f"has shape {meta.shape}")
                if tuple(out.shape[1:]) != dims:
                    self._fail(present, f"the geometry of '{past}' {meta.shape}", f"has shape {out.shape}")
                if geometry is None:
                    geometry, self.cache_dtype = dims, _ORT_TYPES[meta.type]
                elif dims != geometry or _ORT_TYPES[meta.type] != self.cache_dtype:
                    self._fail(past, f"the geometry and type of the first paged layer {geometry}",
                               f"has shape {meta.shape} and type {meta.type}")
        if geometry is None:
            raise ModelLoadError(f"{self.path}: the paged_kv group has no layers.")
        self.cache_geometry = geometry  # (block_size, kv_heads, head_size)
        element = np.dtype(self.cache_dtype).itemsize
        ring = sum(1 for layer in n["paged_layer_ids"] if layer in self.ring_layers)
        # A block of the full pool spans the full layers only (reference E.4: L_full); the ring
        # layers' blocks come from the separate window pool.
        layer_bytes = int(np.prod(geometry)) * element * 2
        self.bytes_per_block = layer_bytes * (len(n["paged_layer_ids"]) - ring)
        self.bytes_per_window_block = layer_bytes * ring

    def _validate_static(self):
        """Static batching (no engine.dynamic_batching): OGA's CPU decoders, GroupQueryAttention over
        per-layer contiguous caches [batch, kv_heads, max_length, head_size] shared by past and present."""
        n = self.names
        self._check(self.inputs, n["input_ids"], ("tensor(int64)",), 2, "input")
        self._check(self.inputs, n["attention_mask"], ("tensor(int64)",), 2, "input")
        if n["position_ids"] in self.inputs:
            raise ModelLoadError(f"{self.path}: static-batching decoders with a '{n['position_ids']}' input are not "
                                 "supported yet by oga.")
        logits = self._check(self.outputs, n["logits"], ("tensor(float)", "tensor(float16)"), 3, "output")
        self.logits_dtype = _ORT_TYPES[logits.type]
        self.per_token_logits = False
        self.windowed_block_table = False
        self.ring_layers = frozenset()
        geometry = None
        for past_k, past_v, present_k, present_v in zip(n["past_key_names"], n["past_value_names"],
                                                         n["present_key_names"], n["present_value_names"]):
            for past, present in ((past_k, present_k), (past_v, present_v)):
                meta = self._check(self.inputs, past, _CACHE_TYPES, 4, "input")
                self._check(self.outputs, present, (meta.type,), 4, "output")
                heads, head_size = meta.shape[1], meta.shape[3]
                if not isinstance(head_size, int):  # OGA's builder names it kv_cache_dim
                    head_size = self.decoder_config.get("head_size")
                if not (isinstance(heads, int) and isinstance(head_size, int)):
                    self._fail(past, "static kv_heads, and a static head_size or model.decoder.head_size "
                               "([batch, kv_heads, sequence, head_size])",
                               f"has shape {meta.shape}")
                if geometry is None:
                    geometry, self.cache_dtype = (heads, head_size), _ORT_TYPES[meta.type]
                elif (heads, head_size) != geometry or _ORT_TYPES[meta.type] != self.cache_dtype:
                    self._fail(past, f"the geometry and type of the first layer {geometry}", f"has shape {meta.shape}")
        if geometry is None:
            raise ModelLoadError(f"{self.path}: the decoder has no past_key_values layers.")
        self.cache_geometry = geometry  # (kv_heads, head_size)
        self.bytes_per_block = 0

    def open_engine(self, geometry):
        if self.static:
            return StaticOnnxEngineExecutor(self, geometry)
        return OnnxEngineExecutor(self, geometry)


class OnnxEngineExecutor:
    """Per-engine state: caches, the IOBinding and the logits buffer, all allocated once."""

    # Every open executor, for tests and diagnostics (the engine owns them; this does not).
    live = weakref.WeakSet()

    def __init__(self, decoder, geometry):
        n = decoder.names
        self.windowed = decoder.windowed_block_table
        if self.windowed and not (geometry.get("window_blocks") and geometry.get("window_ring_blocks")):
            raise RuntimeError(
                f"{decoder.path}: the decoder keeps its sliding-window layers {sorted(decoder.ring_layers)} in a ring "
                f"of blocks ('{n['block_table_windowed']}'), but the engine allocated no window blocks "
                f"(window_blocks {geometry.get('window_blocks', 0)}, window_ring_blocks "
                f"{geometry.get('window_ring_blocks', 0)}); the ring needs dynamic batching with "
                "search.chunk_size > 0.")
        OnnxEngineExecutor.live.add(self)
        self.decoder = decoder
        self.session = decoder.session
        self.binding = self.session.io_binding()
        # (address, shape) bound to each name, so an input whose buffer and shape did not change
        # since the previous step is not rebound.
        self._bound = {}
        self.vocab = n["vocab_size"]
        # the decoder's FixedStateTensor list (empty without fixed state); execute binds them
        self.fixed_states = decoder.fixed_states
        # whether execute also binds each fixed tensor's per-token capture (draft verification)
        self.fixed_state_capture = decoder.fixed_state_capture
        shape = (geometry["num_blocks"],) + tuple(decoder.cache_geometry)
        ring_shape = (geometry.get("window_blocks", 0),) + tuple(decoder.cache_geometry)
        self.caches = []
        # {(layer id, "key" | "value"): cache}: every paged layer's cache (the same arrays as
        # self.caches); a sliding-window ring layer's holds window_blocks blocks
        self.layer_caches = {}
        for layer, past_k, past_v, present_k, present_v in zip(
                n["paged_layer_ids"], n["past_key_names"], n["past_value_names"], n["present_key_names"],
                n["present_value_names"]):
            ring = layer in decoder.ring_layers
            for kind, past, present in (("key", past_k, present_k), ("value", past_v, present_v)):
                cache = np.zeros(ring_shape if ring else shape, dtype=decoder.cache_dtype)
                self.layer_caches[(layer, kind)] = cache
                self.caches.append(cache)
                self._bind_input(past, cache.dtype, cache.shape, cache.ctypes.data)
                self.binding.bind_output(present, "cpu", 0, cache.dtype, cache.shape, cache.ctypes.data)
        rows = geometry["max_scheduled_tokens"] if decoder.per_token_logits else geometry["max_batch_size"]
        self.logits = np.zeros((rows, self.vocab), dtype=decoder.logits_dtype)
        self.logits_type = LOGITS_FLOAT16 if decoder.logits_dtype == np.float16 else LOGITS_FLOAT32
        self.names = n
        # Wall time inside session.run, so benchmarks can separate engine overhead from the model.
        self.session_run_ns = 0

    def _bind_input(self, name, dtype, shape, address):
        key = (address, shape)
        if self._bound.get(name) != key:
            self.binding.bind_input(name, "cpu", 0, dtype, shape, address)
            self._bound[name] = key

    def _bind_fixed_state(self, num_rows, num_tokens, fixed_state):
        """Binds each fixed tensor's (input, output[, capture]) addresses for `num_rows` rows and
        `num_tokens` packed tokens; returns an error message or ""."""
        tensors = self.decoder.fixed_states
        if not tensors:
            if fixed_state:
                return "the step passes fixed_state, but the decoder has no fixed state tensors"
            return ""
        capture = self.decoder.fixed_state_capture
        what = "(input, output, capture) address triples" if capture else "(input, output) address pairs"
        if fixed_state is None or len(fixed_state) != len(tensors):
            return (f"the decoder has {len(tensors)} fixed state tensors "
                    f"({', '.join(t.input_name for t in tensors)}), but the step passes "
                    f"{0 if fixed_state is None else len(fixed_state)} {what}")
        for tensor, entry in zip(tensors, fixed_state):
            try:
                addresses = tuple(int(a) for a in entry)
            except (TypeError, ValueError):
                addresses = ()
            if len(addresses) not in (2, 3):
                return (f"fixed state '{tensor.input_name}': expected an (input address, output address) pair "
                        "or an (input, output, capture) triple")
            source, target = addresses[:2]
            snapshot = addresses[2] if len(addresses) == 3 else 0
            if not source or not target:
                return f"fixed state '{tensor.input_name}': a null address"
            if capture and not snapshot:
                return (f"fixed state '{tensor.input_name}': the decoder writes every packed token's state to "
                        f"'{tensor.capture_name}', but the step passes no capture address")
            if snapshot and not capture:
                return (f"fixed state '{tensor.input_name}': the step passes a capture address, but the decoder "
                        f"has no per-token state output ('{tensor.output_name}{CAPTURE_SUFFIX}')")
            size = num_rows * tensor.row_bytes
            if source < target + size and target < source + size:
                return (f"fixed state '{tensor.input_name}': the output '{tensor.output_name}' overlaps the input "
                        "(a step must not write over the state it reads)")
            if capture:
                captured = num_tokens * tensor.row_bytes
                for name, address in ((tensor.input_name, source), (tensor.output_name, target)):
                    # the input is still being read while captures are written, and two outputs
                    # sharing memory would leave either one's rows undefined
                    if snapshot < address + size and address < snapshot + captured:
                        return (f"fixed state '{tensor.input_name}': the capture '{tensor.capture_name}' overlaps "
                                f"'{name}'")
            shape = (num_rows,) + tensor.row_shape
            self._bind_input(tensor.input_name, tensor.dtype, shape, source)
            key = ("fixed", target, shape)
            if self._bound.get(tensor.output_name) != key:
                self.binding.bind_output(tensor.output_name, "cpu", 0, tensor.dtype, shape, target)
                self._bound[tensor.output_name] = key
            if capture:
                # one row per packed token: rebound whenever the address or the token count changes
                shape = (num_tokens,) + tensor.row_shape
                key = ("capture", snapshot, shape)
                if self._bound.get(tensor.capture_name) != key:
                    self.binding.bind_output(tensor.capture_name, "cpu", 0, tensor.dtype, shape, snapshot)
                    self._bound[tensor.capture_name] = key
        return ""

    def execute(self, num_rows, num_tokens, input_ids, position_ids, cumulative, past, block_table, columns,
                attention_metadata, logits_indices, block_table_windowed=0, fixed_state=None):
        """Binds this step's packed buffers (addresses owned by the engine) and runs the session.
        `fixed_state`: for a decoder with fixed state tensors, one (input address, output address)
        pair per entry of decoder.fixed_states, in that order, each [num_rows, *row_shape]
        contiguous memory of the tensor's dtype, row r being packed row r; the input and output
        must not overlap. When decoder.fixed_state_capture, each entry is an (input, output,
        capture) triple instead, the capture [num_tokens, *row_shape] memory (row t = the state
        after packed token t) overlapping neither; otherwise a third address, if given, must be 0.
        Returns (status, message, logits address, rows)."""
        n = self.names
        bind = self._bind_input
        error = self._bind_fixed_state(num_rows, num_tokens, fixed_state)
        if error:
            return STATUS_FATAL, error, 0, 0
        bind(n["input_ids"], np.int64, (num_tokens,), input_ids)
        bind(n["cumulative_sequence_lengths"], np.int32, (num_rows + 1,), cumulative)
        bind(n["past_sequence_lengths"], np.int32, (num_rows,), past)
        bind(n["block_table"], np.int32, (num_rows, columns), block_table)
        if self.windowed:
            if not block_table_windowed:
                return STATUS_FATAL, (f"the decoder keeps sliding-window layers in a ring, but the step has no "
                                      f"'{n['block_table_windowed']}'"), 0, 0
            bind(n["block_table_windowed"], np.int32, (num_rows, columns), block_table_windowed)
        if self.decoder.has_position_ids:
            bind(n["position_ids"], np.int64, (num_tokens,), position_ids)
        if self.decoder.has_attention_metadata:
            bind(n["attention_metadata"], np.int32, (3,), attention_metadata)
        if self.decoder.has_logits_indices:
            bind(n["logits_indices"], np.int32, (num_rows,), logits_indices)
        rows = num_tokens if self.decoder.per_token_logits else num_rows
        out_key = ("logits", rows)
        if self._bound.get(n["logits"]) != out_key:
            self.binding.bind_output(n["logits"], "cpu", 0, self.logits.dtype, (rows, self.vocab),
                                     self.logits.ctypes.data)
            self._bound[n["logits"]] = out_key
        start = time.perf_counter_ns()
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as error:  # ONNX Runtime raises its own exception types
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        finally:
            self.session_run_ns += time.perf_counter_ns() - start
        return STATUS_OK, "", self.logits.ctypes.data, rows


def load_decoder(names):
    """Entry point of the model loader (OgaExtModelLoader): opens and validates the session."""
    return OnnxDecoder(names)


class StaticOnnxEngineExecutor:
    """Per-engine state of the static path: per-layer caches [max_batch_size, kv_heads, max_length,
    head_size] allocated once and zeroed, bound as both past and present (GroupQueryAttention then
    updates them in place); a step uses the leading `batch_size` rows, which are contiguous."""

    live = OnnxEngineExecutor.live

    def __init__(self, decoder, geometry):
        OnnxEngineExecutor.live.add(self)
        self.decoder = decoder
        self.session = decoder.session
        self.binding = self.session.io_binding()
        self.names = n = decoder.names
        self.vocab = n["vocab_size"]
        heads, head_size = decoder.cache_geometry
        rows, length = geometry["max_batch_size"], geometry["max_sequence_length"]
        self.caches = [(name, present, np.zeros((rows, heads, length, head_size), dtype=decoder.cache_dtype))
                       for pasts, presents in ((n["past_key_names"], n["present_key_names"]),
                                               (n["past_value_names"], n["present_value_names"]))
                       for name, present in zip(pasts, presents)]
        # Logits of every query position of a step (grown on demand: a prefill needs rows x prompt x
        # vocab), and the one row per request the engine reads.
        self.step_logits = np.empty(0, dtype=decoder.logits_dtype)
        self.logits = np.zeros((rows, self.vocab), dtype=decoder.logits_dtype)
        self.logits_type = LOGITS_FLOAT16 if decoder.logits_dtype == np.float16 else LOGITS_FLOAT32
        self.session_run_ns = 0
        self._bound_rows = None

    def execute_static(self, batch_size, sequence_length, total_length, input_ids, attention_mask, positions):
        n = self.names
        if self._bound_rows != batch_size:
            for past, present, cache in self.caches:
                view = cache[:batch_size]
                self.binding.bind_input(past, "cpu", 0, cache.dtype, view.shape, view.ctypes.data)
                self.binding.bind_output(present, "cpu", 0, cache.dtype, view.shape, view.ctypes.data)
            self._bound_rows = batch_size
        self.binding.bind_input(n["input_ids"], "cpu", 0, np.int64, (batch_size, sequence_length), input_ids)
        self.binding.bind_input(n["attention_mask"], "cpu", 0, np.int64, (batch_size, total_length), attention_mask)
        needed = batch_size * sequence_length * self.vocab
        if self.step_logits.size < needed:
            self.step_logits = np.empty(needed, dtype=self.logits.dtype)
        step_logits = self.step_logits[:needed].reshape(batch_size, sequence_length, self.vocab)
        self.binding.bind_output(n["logits"], "cpu", 0, step_logits.dtype, step_logits.shape, step_logits.ctypes.data)
        start = time.perf_counter_ns()
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as error:
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        finally:
            self.session_run_ns += time.perf_counter_ns() - start
        wanted = np.ctypeslib.as_array((ctypes.c_int32 * batch_size).from_address(positions))
        self.logits[:batch_size] = step_logits[np.arange(batch_size), wanted]
        return STATUS_OK, "", self.logits.ctypes.data, batch_size
