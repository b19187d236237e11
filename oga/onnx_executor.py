"""The ONNX Runtime model executor: runs a paged decoder for the engine core.

The core hands every step over as packed buffers it owns (see OgaExtStepInputs in
include/oga/oga_ext.h). On the host path (CPU provider) this module binds those buffers to the
session by address through IOBinding, so nothing is copied on the way in; the KV caches are allocated once per engine,
zeroed, and bound as both the cache input and the cache output of every layer, so ONNX Runtime
updates them in place (the graph must produce each present cache straight out of ScatterND). The
logits land in a buffer allocated once at the configured row limit.

Sliding-window ring layers: when the graph takes `block_table_windowed`, the layers named by
model.decoder.sliding_window keep their KV in a ring; their caches are
[window_blocks, block_size, kv_heads, head_size] (window_blocks from the engine geometry), bound
the same way, and every step binds the engine's windowed block table next to the full one.

Fixed decoder state (hybrid models; seed "Fixed request-state pools"): model.decoder.state_groups
may list fixed_conv / fixed_recurrent groups beside the paged_kv group. OnnxDecoder expands their
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

Devices (oga/device.py). The host path above runs whenever the session runs on the CPU provider.
When ONNX Runtime puts the session on CUDAExecutionProvider, OnnxDecoder opens
`oga.device.CudaDevice(device_id)` before creating the session and passes the device's stream as the
provider's `user_compute_stream`, so ONNX Runtime's kernels and the executor's copies share one
stream; open_engine then returns a DeviceOnnxEngineExecutor: paged and ring caches allocated on the
device once and zero-filled, bound as past and present as on the host path; one device buffer
holding every packed input at its configured limit, filled each step from one pinned staging buffer
with at most one upload per input, and bound at addresses that never change; the logits in a device
buffer at the row limit, handed to the engine as device logits (OgaExtStepOutputs.logits_on_device):
the decoder's `device_ops` (oga.device_ops.DeviceOps over the same device and stream, the core's
OgaExtDeviceOps) select tokens there with the sampling kernels and read back only the rows the
engine selects on the host (without device ops the executor copies the rows back itself). When the config's cuda provider options set enable_cuda_graph, the decoder
declares OgaExtModelExecutor.cuda_graph and every step runs with the run option gpu_graph_id =
OgaExtStepInputs.graph_id (-1: eager). Fixed state stays engine-owned, in device memory the core
allocates and copies through those device ops; its addresses are bound with the device's ONNX
Runtime device type. Device out-of-memory at open_engine is a capacity failure
(MemoryError); ONNX Runtime's CUDA out-of-memory texts during a run are classified as capacity too.
Tests run the same device path on the CPU provider with oga.device.HostDevice
(oga.testing.device_path, through set_cpu_device_factory).

The Cython trampolines in _core.pyx call `load_decoder` (at OgaCreateModel) and the methods of
`OnnxDecoder` / `OnnxEngineExecutor` (at engine creation, at every step, and `close` at engine
close).
"""
import ctypes
import dataclasses
import json
import os
import time
import weakref
from dataclasses import dataclass

import numpy as np

from .device import ALIGNMENT

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
# "out of memory" covers the CUDA provider's "CUDA failure 2: out of memory", "failed to allocate
# memory" its BFC arena's "Failed to allocate memory for requested buffer of size N"; cuBLAS and
# cuDNN report their own workspace failures.
_OUT_OF_MEMORY_MARKERS = ("bad_alloc", "failed to allocate memory", "out of memory", "cudaerrormemoryallocation",
                          "cuda_error_out_of_memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


class ModelLoadError(RuntimeError):
    pass


def _positive_int(value):
    """A genai_config.json count: a positive whole number (2 or 2.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():  # also NaN and the infinities
        return None
    return int(value) if value > 0 else None


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
    """Maps an ONNX Runtime exception to an OgaExtExecutionStatus. Only Exceptions are classified:
    a BaseException that is not one (KeyboardInterrupt from a signal handler, SystemExit) is left to
    propagate out of the executor to the _core.pyx trampoline, which reports the step Interrupted
    (rolled back, the engine healthy) and has Engine.run raise it once the core returns."""
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
    if "CPUExecutionProvider" not in providers:  # the fallback (ONNX Runtime refuses a duplicate)
        providers.append("CPUExecutionProvider")
        options.append({})
    return providers, options


def _truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _asks_for_cuda_graph(session_config):
    """Whether model.decoder.session_options.provider_options has a cuda entry with enable_cuda_graph on."""
    for entry in session_config.get("provider_options", []) or []:
        for name, values in entry.items():
            if name.lower() in ("cuda", "cudaexecutionprovider") and _truthy((values or {}).get("enable_cuda_graph")):
                return True
    return False


# Test-only: a device factory for decoders whose session runs on the CPU provider, so the device
# path runs on CPU (oga.testing.device_path installs oga.device.HostDevice). None in production.
_cpu_device_factory = None


def set_cpu_device_factory(factory):
    """Test-only. Decoders loaded from now on whose session runs on the CPU provider take the device
    path on `factory()` (an oga.device interface object with ort_device_type "cpu"); None restores
    the host path. Returns the previous factory. A decoder keeps its device for its lifetime."""
    global _cpu_device_factory
    previous, _cpu_device_factory = _cpu_device_factory, factory
    return previous


def _open_cuda_device(path, device_id):
    """oga.device.CudaDevice(device_id), or a ModelLoadError that says why it cannot be opened. A
    device whose kernels cannot be loaded (no built binary and no NVRTC) still runs the model: the
    engine then selects tokens on the host from logits rows read back (RuntimeWarning)."""
    from . import device as device_module
    from .cuda_kernels import CudaUnavailable

    try:
        try:
            return device_module.CudaDevice(device_id)
        except CudaUnavailable as kernels_error:
            device = device_module.CudaDevice(device_id, with_kernels=False)
            import warnings

            warnings.warn(f"{path}: the CUDA sampling kernels cannot be loaded ({kernels_error}); tokens are "
                          "selected on the host from logits rows read back each step.", RuntimeWarning, stacklevel=3)
            return device
    except Exception as error:
        raise ModelLoadError(
            f"{path}: the session would run on CUDAExecutionProvider (device {device_id}), but oga cannot open that "
            f"CUDA device for its caches and inputs: {type(error).__name__}: {error}") from error


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

    def __init__(self, names, executor=None):
        """`executor`: "native" or "python" as the model loader selected it (native_executor.requested);
        None (tests driving this executor directly): a Python session, recorded nowhere."""
        import onnxruntime as ort

        self.names = names
        config = json.loads(names["config_json"])
        decoder_config = config.get("model", {}).get("decoder", {})
        self.decoder_config = decoder_config
        self.path = os.path.join(names["model_directory"], names["decoder_filename"])
        if not os.path.isfile(self.path):
            raise ModelLoadError(f"The decoder file {self.path} does not exist (model.decoder.filename).")
        options = ort.SessionOptions()
        # oga's own operators (the fused CPU graphs' paged attention), on every session
        from . import ortops
        ortops.register(options)
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
        # The device path: where the caches, the staged inputs and the logits live (see the module
        # docstring). None = the host path.
        self.device = None
        self.device_ops = None
        self.session = None
        try:
            self._open(ort, options, session_config, chosen, wants_cuda, cuda_reason, executor)
        except BaseException:
            self.close()
            raise

    def _native_session(self, session_config, chosen, executor):
        """The decoder's session created by the native executor (oga/native_executor.py), or None
        when the Python executor runs it (the reason recorded there)."""
        if executor is None:
            return None
        from . import native_executor

        fixed_groups = any(isinstance(g, dict) and g.get("kind") in FIXED_STATE_KINDS
                           for g in self.decoder_config.get("state_groups") or [])
        device_path = self.device is not None or _cpu_device_factory is not None
        reason = native_executor.python_session_reason(executor, not self.names["block_size"], fixed_groups, chosen,
                                                       device_path)
        return native_executor.open_session(self.path, session_config, reason)

    def _open(self, ort, options, session_config, chosen, wants_cuda, cuda_reason, executor):
        if chosen and chosen[0][0] == "CUDAExecutionProvider":
            cuda_options = chosen[0][1]
            self.device = _open_cuda_device(self.path, int(cuda_options.get("device_id", 0)))
            # ONNX Runtime's kernels and the executor's staging copies on one stream: an upload is
            # ordered before the run that reads it, with no synchronization in between.
            cuda_options["user_compute_stream"] = str(int(self.device.stream))
            if "enable_cuda_graph" in cuda_options:
                cuda_options["enable_cuda_graph"] = "1" if _truthy(cuda_options["enable_cuda_graph"]) else "0"
        try:
            self.session = self._native_session(session_config, chosen, executor)
            if self.session is None:
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
        if self.device is not None and (not self.providers or self.providers[0] != "CUDAExecutionProvider"):
            # ONNX Runtime could not register the CUDA provider after all (it then falls back to the
            # CPU provider with a warning of its own): host memory, then.
            device, self.device = self.device, None
            device.close()
        if self.device is None and _cpu_device_factory is not None:
            self.device = _cpu_device_factory()  # test-only (oga.testing.device_path)
        # Capability OgaExtModelExecutor.cuda_graph: the config's cuda provider options ask for
        # enable_cuda_graph and the device path runs (it keeps every graph input at a fixed address).
        # On the CPU test path the cuda entry is read although ONNX Runtime dropped it, so the graph
        # ids travel all the way to the run options; the CPU provider ignores gpu_graph_id.
        self.cuda_graph = self.device is not None and _asks_for_cuda_graph(session_config)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = {o.name: o for o in self.session.get_outputs()}
        self._validate()
        if self.static and self.device is not None:
            if self.device.ort_device_type != "cpu":
                raise ModelLoadError(
                    f"{self.path}: this is a static-batching decoder (contiguous caches, no "
                    "engine.dynamic_batching), and oga runs those on the CPU provider only; the session runs on "
                    "CUDAExecutionProvider. Remove the cuda entry of model.decoder.session_options.provider_options.")
            device, self.device = self.device, None  # the CPU test path covers paged decoders only
            device.close()
            self.cuda_graph = False
        # OgaExtDeviceOps for the engine core (_core.pyx hands them over at load): the fixed-state
        # pool's memory, the read-back of logits rows and batched sampling on the device's stream
        # (the one the session runs on), and the device's free memory for sizing the KV cache.
        if self.device is not None:
            from .device_ops import DeviceOps

            self.device_ops = DeviceOps(self.device)

    def close(self):
        """At model release (release_model, after every engine on the model closed) or when loading
        fails: the device memory the DeviceOps holds (sampling staging and scratch, copy staging), then
        the device (what is still allocated on it and its stream). A CudaDevice frees nothing when it is
        garbage-collected, so without this every model load leaked them. Idempotent (both closes are);
        the objects stay reachable for inspection. The session goes first: ONNX Runtime's CUDA
        provider runs on the device's stream (user_compute_stream), which the device destroys."""
        if hasattr(self.session, "_hand_over"):
            self.session.close()  # a native session the executor table did not take (a failed load)
        if self.device is not None:
            self.session = None  # the last reference unless an executor object outlives its engine
        try:
            if self.device_ops is not None:
                self.device_ops.close()
        finally:
            if self.device is not None:
                self.device.close()

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
        self.cache_tensors = ()  # set by _validate_caches / _validate_static
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
        """The fixed_conv / fixed_recurrent groups of model.decoder.state_groups (seed "Fixed request-state
        pools")."""
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

    # -- cache geometry: every cache tensor against what the engine allocates for it ---------------
    def _check_dimension(self, name, shape, axis, value, source):
        """A dimension the graph fixes must be `value` (what the engine allocates, `source` saying
        why); a symbolic one takes it."""
        dim = shape[axis]
        if isinstance(dim, int) and dim != value:
            raise ModelLoadError(f"{self.path}: {name} dimension {axis} is {dim} in the graph, but {source}.")

    def _check_cache_type(self, name, meta, first, first_meta):
        if meta.type != first_meta.type:
            raise ModelLoadError(f"{self.path}: {name} has type {meta.type} in the graph, but the KV cache is "
                                 f"{first_meta.type} (the type of {first}).")

    def _kv_heads(self, first, first_meta, axis):
        """The KV heads the engine allocates: model.decoder.num_key_value_heads (as 0.18), else the
        graph's static dimension `axis` of the first cache. Returns (heads, what the message says)."""
        heads = _positive_int(self.decoder_config.get("num_key_value_heads"))
        if heads is not None:
            return heads, f"model.decoder.num_key_value_heads is {heads}"
        heads = first_meta.shape[axis]
        if not isinstance(heads, int) or heads <= 0:
            raise ModelLoadError(f"{self.path}: {first} dimension {axis} (the KV heads) is {heads!r} in the graph, and "
                                 "model.decoder.num_key_value_heads is not set, so the engine cannot size the KV cache.")
        return heads, f"the KV cache has {heads} KV heads (dimension {axis} of {first})"

    def _configured_num_blocks(self):
        """engine.dynamic_batching.num_blocks of the effective config, or None (automatic sizing)."""
        engine = json.loads(self.names["config_json"]).get("engine") or {}
        batching = engine.get("dynamic_batching") if isinstance(engine, dict) else None
        return _positive_int(batching.get("num_blocks")) if isinstance(batching, dict) else None

    def _validate_caches(self):
        """Every paged cache input and output against what the engine allocates and binds to both,
        [blocks, block_size, kv_heads, head width] of one type, as 0.18 sizes them: the type and the
        static head width of the first paged key input, block_size from engine.dynamic_batching, the KV
        heads from model.decoder.num_key_value_heads (the graph's when the config has none), and as
        blocks engine.dynamic_batching.num_blocks (a ring layer: the engine's window blocks). A
        dimension the graph fixes must match; a symbolic one takes the engine's. Dimension 0 is
        checked here against a configured num_blocks and at engine creation against the count the
        engine allocates (check_engine_geometry)."""
        n = self.names
        tensors = []  # (layer, name, graph metadata) of every paged cache input and output
        for layer, past_k, past_v, present_k, present_v in zip(
                n["paged_layer_ids"], n["past_key_names"], n["past_value_names"], n["present_key_names"],
                n["present_value_names"]):
            for past, present in ((past_k, present_k), (past_v, present_v)):
                meta = self._check(self.inputs, past, _CACHE_TYPES, None, "input")
                if len(meta.shape) != 4 or not (isinstance(meta.shape[3], int) and meta.shape[3] > 0):
                    # 0.18's text (its engine reads the head width from the graph, too)
                    raise ModelLoadError(f"Paged cache input must have rank four and a static physical head width: "
                                         f"{past}")
                out = self._check(self.outputs, present, _CACHE_TYPES, 4, "output")
                tensors += [(layer, past, meta), (layer, present, out)]
        if not tensors:
            raise ModelLoadError(f"{self.path}: the paged_kv group has no layers.")
        _, first, first_meta = tensors[0]
        heads, heads_source = self._kv_heads(first, first_meta, 2)
        width = first_meta.shape[3]
        expected = ((1, n["block_size"], f"engine.dynamic_batching.block_size is {n['block_size']}"),
                    (2, heads, heads_source),
                    (3, width, f"the KV cache's head width is {width} (dimension 3 of {first})"))
        num_blocks = self._configured_num_blocks()
        for layer, name, meta in tensors:
            self._check_cache_type(name, meta, first, first_meta)
            if num_blocks is not None and layer not in self.ring_layers:
                self._check_dimension(name, meta.shape, 0, num_blocks,
                                      f"engine.dynamic_batching.num_blocks is {num_blocks}")
            for axis, value, source in expected:
                self._check_dimension(name, meta.shape, axis, value, source)
        self.cache_tensors = tuple(tensors)
        self.cache_dtype = _ORT_TYPES[first_meta.type]
        geometry = (n["block_size"], heads, width)
        self.cache_geometry = geometry  # (block_size, kv_heads, head_size)
        element = np.dtype(self.cache_dtype).itemsize
        ring = sum(1 for layer in n["paged_layer_ids"] if layer in self.ring_layers)
        # A block of the full pool spans the full layers only (seed "Decoder state manifest"); the ring
        # layers' blocks come from the separate window pool.
        layer_bytes = int(np.prod(geometry)) * element * 2
        self.bytes_per_block = layer_bytes * (len(n["paged_layer_ids"]) - ring)
        self.bytes_per_window_block = layer_bytes * ring

    def _validate_static(self):
        """Static batching (no engine.dynamic_batching): OGA's CPU decoders, GroupQueryAttention over
        per-layer contiguous caches [batch, kv_heads, max_length, head_size] shared by past and present.
        The engine allocates model.decoder.num_key_value_heads heads (the graph's when the config has
        none) of the graph's static head size (model.decoder.head_size when symbolic; OGA's builder
        names it kv_cache_dim), of the first cache's type; the batch and sequence dimensions are
        checked at engine creation (check_engine_geometry)."""
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
        tensors = []  # (name, graph metadata) of every cache input and output
        for past_k, past_v, present_k, present_v in zip(n["past_key_names"], n["past_value_names"],
                                                         n["present_key_names"], n["present_value_names"]):
            for past, present in ((past_k, present_k), (past_v, present_v)):
                tensors.append((past, self._check(self.inputs, past, _CACHE_TYPES, 4, "input")))
                tensors.append((present, self._check(self.outputs, present, _CACHE_TYPES, 4, "output")))
        if not tensors:
            raise ModelLoadError(f"{self.path}: the decoder has no past_key_values layers.")
        first, first_meta = tensors[0]
        heads, heads_source = self._kv_heads(first, first_meta, 1)
        head_size = first_meta.shape[3]
        if isinstance(head_size, int) and head_size > 0:
            head_source = f"the KV cache's head size is {head_size} (dimension 3 of {first})"
        else:
            head_size = _positive_int(self.decoder_config.get("head_size"))
            if head_size is None:
                raise ModelLoadError(f"{self.path}: {first} dimension 3 (the head size) is {first_meta.shape[3]!r} in "
                                     "the graph, and model.decoder.head_size is not set, so the engine cannot size the "
                                     "KV cache.")
            head_source = f"model.decoder.head_size is {head_size}"
        for name, meta in tensors:
            self._check_cache_type(name, meta, first, first_meta)
            self._check_dimension(name, meta.shape, 1, heads, heads_source)
            self._check_dimension(name, meta.shape, 3, head_size, head_source)
        self.cache_tensors = tuple(tensors)
        self.cache_dtype = _ORT_TYPES[first_meta.type]
        self.cache_geometry = (heads, head_size)
        self.bytes_per_block = 0

    def check_engine_geometry(self, geometry):
        """At engine creation: the dimensions the graph fixes that only the engine's geometry
        decides. Paged caches: dimension 0 is the engine's block count (a ring layer's: its window
        blocks). Static caches: dimension 0 is the batch's row count (1 to max_batch_size), dimension
        2 the positions the engine allocates per request."""
        if self.static:
            rows, length = geometry["max_batch_size"], geometry["max_sequence_length"]
            for name, meta in self.cache_tensors:
                batch = meta.shape[0]
                if isinstance(batch, int) and not batch == rows == 1:
                    binds = ("1 row (engine.static_batching.max_batch_size is 1)" if rows == 1 else
                             f"one row per request of a batch, 1 to {rows} rows (engine.static_batching.max_batch_size "
                             f"is {rows}); the graph's batch dimension must be symbolic")
                    raise ModelLoadError(f"{self.path}: {name} dimension 0 is {batch} in the graph, but the engine "
                                         f"binds {binds}.")
                self._check_dimension(name, meta.shape, 2, length,
                                      f"the engine allocates {length} positions per request (search.max_length, "
                                      "else model.context_length)")
            return
        blocks, window_blocks = geometry["num_blocks"], geometry.get("window_blocks", 0)
        if self._configured_num_blocks() == blocks:
            full = f"engine.dynamic_batching.num_blocks is {blocks}"
        else:
            full = (f"the engine sized the KV cache to {blocks} blocks (engine.dynamic_batching."
                    "gpu_utilization_factor); set engine.dynamic_batching.num_blocks to the graph's count")
        ring = (f"the engine allocates {window_blocks} ring blocks for the sliding-window layers "
                f"({geometry.get('window_ring_blocks', 0)} per request, from model.decoder.sliding_window.window_size "
                f"and search.chunk_size, for engine.dynamic_batching.max_batch_size {geometry['max_batch_size']} "
                "requests)")
        for layer, name, meta in self.cache_tensors:
            if layer in self.ring_layers:
                self._check_dimension(name, meta.shape, 0, window_blocks, ring)
            else:
                self._check_dimension(name, meta.shape, 0, blocks, full)

    def open_engine(self, geometry):
        self.check_engine_geometry(geometry)
        if self.static:
            return StaticOnnxEngineExecutor(self, geometry)
        if self.device is not None:
            return DeviceOnnxEngineExecutor(self, geometry)
        return OnnxEngineExecutor(self, geometry)


class OnnxEngineExecutor:
    """Per-engine state: caches, the IOBinding and the logits buffer, all allocated once. The host
    path: caches and logits in host memory, the engine's packed buffers bound where they are."""

    # Every open executor, for tests and diagnostics (the engine owns them; this does not).
    live = weakref.WeakSet()
    # ONNX Runtime's (device type, device id) of the memory bound to the session.
    ort_device = ("cpu", 0)
    # OgaExtStepOutputs.logits_on_device: the host path's logits are host memory.
    logits_on_device = 0

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
        self.names = n
        # the decoder's FixedStateTensor list (empty without fixed state); execute binds them
        self.fixed_states = decoder.fixed_states
        # whether execute also binds each fixed tensor's per-token capture (draft verification)
        self.fixed_state_capture = decoder.fixed_state_capture
        # Wall time inside session.run, so benchmarks can separate engine overhead from the model.
        self.session_run_ns = 0
        shape = (geometry["num_blocks"],) + tuple(decoder.cache_geometry)
        ring_shape = (geometry.get("window_blocks", 0),) + tuple(decoder.cache_geometry)
        self.caches = []
        # {(layer id, "key" | "value"): cache}: every paged layer's cache (the same objects as
        # self.caches: arrays here, device addresses on the device path); a sliding-window ring
        # layer's holds window_blocks blocks
        self.layer_caches = {}
        for layer, past_k, past_v, present_k, present_v in zip(
                n["paged_layer_ids"], n["past_key_names"], n["past_value_names"], n["present_key_names"],
                n["present_value_names"]):
            ring = layer in decoder.ring_layers
            for kind, past, present in (("key", past_k, present_k), ("value", past_v, present_v)):
                cache_shape = ring_shape if ring else shape
                cache, address = self._new_cache(cache_shape, decoder.cache_dtype)
                self.layer_caches[(layer, kind)] = cache
                self.caches.append(cache)
                self._bind_input(past, decoder.cache_dtype, cache_shape, address)
                self._bind_output(present, decoder.cache_dtype, cache_shape, address)
        rows = geometry["max_scheduled_tokens"] if decoder.per_token_logits else geometry["max_batch_size"]
        self._new_logits(rows, decoder.logits_dtype)
        self.logits_type = LOGITS_FLOAT16 if decoder.logits_dtype == np.float16 else LOGITS_FLOAT32

    def _new_cache(self, shape, dtype):
        """A zeroed cache: (the object kept in self.caches, its address)."""
        cache = np.zeros(shape, dtype=dtype)
        return cache, cache.ctypes.data

    def _new_logits(self, rows, dtype):
        self.logits = np.zeros((rows, self.vocab), dtype=dtype)

    def close(self):
        """Called when the engine closes (close_engine): host memory goes with this object."""

    def _bind_input(self, name, dtype, shape, address, device=None):
        key = (address, shape)
        if self._bound.get(name) != key:
            device_type, device_id = device or self.ort_device
            self.binding.bind_input(name, device_type, device_id, dtype, shape, address)
            self._bound[name] = key

    def _bind_output(self, name, dtype, shape, address):
        key = ("output", address, shape)
        if self._bound.get(name) != key:
            device_type, device_id = self.ort_device
            self.binding.bind_output(name, device_type, device_id, dtype, shape, address)
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
            # The engine owns this memory (on the executor's device through OgaExtDeviceOps when
            # the session runs on one): bound where it is, with the device's ONNX Runtime type.
            shape = (num_rows,) + tensor.row_shape
            self._bind_input(tensor.input_name, tensor.dtype, shape, source)
            self._bind_output(tensor.output_name, tensor.dtype, shape, target)
            if capture:
                # one row per packed token: rebound whenever the address or the token count changes
                self._bind_output(tensor.capture_name, tensor.dtype, (num_tokens,) + tensor.row_shape, snapshot)
        return ""

    def execute(self, num_rows, num_tokens, input_ids, position_ids, cumulative, past, block_table, columns,
                attention_metadata, logits_indices, block_table_windowed=0, fixed_state=None, graph_id=-1):
        """Binds this step's packed buffers (addresses owned by the engine) and runs the session.
        `fixed_state`: for a decoder with fixed state tensors, one (input address, output address)
        pair per entry of decoder.fixed_states, in that order, each [num_rows, *row_shape]
        contiguous memory of the tensor's dtype, row r being packed row r; the input and output
        must not overlap. When decoder.fixed_state_capture, each entry is an (input, output,
        capture) triple instead, the capture [num_tokens, *row_shape] memory (row t = the state
        after packed token t) overlapping neither; otherwise a third address, if given, must be 0.
        `graph_id` (OgaExtStepInputs.graph_id) is always -1 here: the host path does not declare
        cuda_graph. Returns (status, message, logits address, rows)."""
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
        self._bind_output(n["logits"], self.logits.dtype, (rows, self.vocab), self.logits.ctypes.data)
        start = time.perf_counter_ns()
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as error:  # ONNX Runtime raises its own exception types
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        finally:
            self.session_run_ns += time.perf_counter_ns() - start
        return STATUS_OK, "", self.logits.ctypes.data, rows


# Bytes of unused capacity between two staged inputs that one upload may carry along instead of
# starting a second copy: a copy call costs roughly what moving 64 KiB over PCIe does.
UPLOAD_MERGE_GAP = 64 * 1024


def _aligned(size):
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class DeviceOnnxEngineExecutor(OnnxEngineExecutor):
    """The device path (a session on CUDAExecutionProvider, or the CPU test path with HostDevice):
    caches, packed inputs and logits in memory of `decoder.device`, allocated once here and never
    moved, so a captured CUDA graph can replay over them.

    Every step packs the engine's host arrays into one host staging buffer (pinned on CUDA) laid out
    like the device input buffer, each input at a fixed offset sized for its configured limit, and
    uploads the used part with at most one copy per input (neighbours merged into one copy when the
    capacity between them is small). Inputs are bound as views of the device buffer, rebound only
    when a shape changes. attention_metadata stays in the staging buffer and is bound as CPU memory:
    PagedAttention's CUDA kernel declares it a CPU input (seed: "a CPU int32[3] attention metadata
    input"), and a graph reads it only while it is captured. The logits land in a device buffer at
    the row limit; see `logits_on_device` for how they reach the engine."""

    def __init__(self, decoder, geometry):
        self.device = decoder.device
        self.ort_device = (self.device.ort_device_type, int(self.device.device_id))
        self._allocations = []  # device addresses this executor owns, released by close()
        self.cuda_graph = decoder.cuda_graph
        self._run_options = {}  # graph id -> RunOptions carrying gpu_graph_id
        self._graphs_seen = set()  # graph ids that ran once (eagerly, see _run_options_for)
        # OgaExtStepOutputs.logits_on_device. 1 (the decoder hands the core its DeviceOps): execute
        # returns the device address and copies nothing; the engine samples on the device and reads
        # back only the rows it selects on the host. 0: each step's logits rows are copied back into
        # a pinned host buffer with one device-to-host copy.
        self.logits_on_device = 1 if decoder.device_ops is not None else 0
        try:
            super().__init__(decoder, geometry)
            self._allocate_inputs(decoder, geometry)
            if decoder.device_ops is not None:
                # The sampler's staging and scratch at the step limits, so no step allocates.
                rows = geometry["max_batch_size"]
                decoder.device_ops.reserve(rows, self.vocab, row_stride=self.vocab,
                                           logits_itemsize=self.logits.itemsize, max_copies=rows)
            self.device.synchronize()  # the caches' zero fill is complete before the first run
        except BaseException:
            self.close()
            raise

    def _allocate(self, nbytes):
        address = self.device.allocate(nbytes)
        self._allocations.append(address)
        return address

    def _new_cache(self, shape, dtype):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        address = self._allocate(nbytes)
        self.device.fill_zero(address, nbytes)
        return address, address

    def _new_logits(self, rows, dtype):
        nbytes = rows * self.vocab * np.dtype(dtype).itemsize
        self.device_logits = self._allocate(nbytes)
        if self.logits_on_device:
            # Never written: the engine reads the device logits through the DeviceOps. An untouched
            # np.empty (no pages committed) keeps the row limit and dtype; pinned memory here would
            # lock rows x vocab x itemsize of host memory for nothing (max_scheduled_tokens rows on a
            # per-token-logits decoder).
            self.logits = np.empty((rows, self.vocab), dtype=dtype)
        else:
            # where a step's logits rows are copied back to (pinned on CUDA)
            self.logits = self.device.host_buffer(nbytes).view(dtype).reshape(rows, self.vocab)

    def _allocate_inputs(self, decoder, geometry):
        """The device input buffer and the staging buffer: every packed input at its limit."""
        n = self.names
        rows, tokens = geometry["max_batch_size"], geometry["max_scheduled_tokens"]
        table = rows * geometry["max_block_table_columns"]
        # (graph input name, dtype, elements at the limit); the fixed-size row arrays first, the
        # block tables last, so a step's used bytes sit mostly at the front of the buffer.
        inputs = [(n["cumulative_sequence_lengths"], np.int32, rows + 1), (n["past_sequence_lengths"], np.int32, rows)]
        if decoder.has_logits_indices:
            inputs.append((n["logits_indices"], np.int32, rows))
        inputs.append((n["input_ids"], np.int64, tokens))
        if decoder.has_position_ids:
            inputs.append((n["position_ids"], np.int64, tokens))
        inputs.append((n["block_table"], np.int32, table))
        if self.windowed:
            inputs.append((n["block_table_windowed"], np.int32, table))
        # name -> (offset, dtype, limit) in both buffers
        self.input_slots = {}
        offset = 0
        for name, dtype, limit in inputs:
            self.input_slots[name] = (offset, dtype, limit)
            offset = _aligned(offset + limit * np.dtype(dtype).itemsize)
        self.device_inputs = self._allocate(offset)
        self.device_inputs_bytes = offset
        self._metadata_offset = offset  # host only, past the uploaded region
        self.staging = self.device.host_buffer(offset + _aligned(3 * 4))
        self._staging_address = self.staging.ctypes.data

    def close(self):
        """Releases the device memory (at engine close, or when open_engine fails); idempotent."""
        allocations, self._allocations = self._allocations, []
        for address in allocations:
            self.device.release(address)
        self.caches = []
        self.layer_caches = {}

    def _stage(self, name, source, count):
        """Copies `count` elements of the engine's array at `source` into the input's staging slot;
        returns the slot's used byte range (the same offsets in the device buffer)."""
        offset, dtype, limit = self.input_slots[name]
        if count > limit:
            raise ValueError(f"the step has {count} elements of '{name}', above the {limit} the executor "
                             "allocated at open_engine")
        nbytes = count * np.dtype(dtype).itemsize
        ctypes.memmove(self._staging_address + offset, source, nbytes)
        return offset, offset + nbytes

    def _upload(self, ranges):
        """One host-to-device copy per used range, neighbours closer than UPLOAD_MERGE_GAP merged."""
        merged = []
        for start, end in sorted(r for r in ranges if r[1] > r[0]):
            if merged and start - merged[-1][1] <= UPLOAD_MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in merged:
            self.device.upload(self.device_inputs + start, self._staging_address + start, end - start)

    def _run_options_for(self, graph_id):
        """RunOptions with gpu_graph_id (-1: eager) when the executor declares cuda_graph, else None."""
        if not self.cuda_graph:
            return None
        if graph_id >= 0 and graph_id not in self._graphs_seen:
            # A graph id's first step runs eagerly. ONNX Runtime's CUDA provider captures after a
            # count of ordinary runs that (in some versions) is kept per thread rather than per graph,
            # so it may capture a new graph on its first run; a capture that has to grow the memory
            # arena fails. The eager run leaves the arena holding that shape's activations.
            self._graphs_seen.add(graph_id)
            graph_id = -1
        options = self._run_options.get(graph_id)
        if options is None:
            import onnxruntime as ort

            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(int(graph_id)))
            self._run_options[graph_id] = options
        return options

    def execute(self, num_rows, num_tokens, input_ids, position_ids, cumulative, past, block_table, columns,
                attention_metadata, logits_indices, block_table_windowed=0, fixed_state=None, graph_id=-1):
        """As OnnxEngineExecutor.execute; `graph_id` (OgaExtStepInputs.graph_id) becomes the run
        option gpu_graph_id when the executor declares cuda_graph. The returned logits address is
        host memory unless `logits_on_device`."""
        n = self.names
        error = self._bind_fixed_state(num_rows, num_tokens, fixed_state)
        if error:
            return STATUS_FATAL, error, 0, 0
        if self.windowed and not block_table_windowed:
            return STATUS_FATAL, (f"the decoder keeps sliding-window layers in a ring, but the step has no "
                                  f"'{n['block_table_windowed']}'"), 0, 0
        if graph_id >= 0 and not self.cuda_graph:
            return STATUS_FATAL, (f"the step asks for CUDA graph {graph_id}, but the executor declares no "
                                  "cuda_graph"), 0, 0
        try:
            step = [(n["input_ids"], input_ids, num_tokens, (num_tokens,)),
                    (n["cumulative_sequence_lengths"], cumulative, num_rows + 1, (num_rows + 1,)),
                    (n["past_sequence_lengths"], past, num_rows, (num_rows,)),
                    (n["block_table"], block_table, num_rows * columns, (num_rows, columns))]
            if self.windowed:
                step.append((n["block_table_windowed"], block_table_windowed, num_rows * columns, (num_rows, columns)))
            if self.decoder.has_position_ids:
                step.append((n["position_ids"], position_ids, num_tokens, (num_tokens,)))
            if self.decoder.has_logits_indices:
                step.append((n["logits_indices"], logits_indices, num_rows, (num_rows,)))
            ranges = []
            for name, source, count, shape in step:
                ranges.append(self._stage(name, source, count))
                offset, dtype, _ = self.input_slots[name]
                self._bind_input(name, dtype, shape, self.device_inputs + offset)
            self._upload(ranges)
            if self.decoder.has_attention_metadata:
                metadata = self._staging_address + self._metadata_offset
                ctypes.memmove(metadata, attention_metadata, 3 * 4)
                self._bind_input(n["attention_metadata"], np.int32, (3,), metadata, device=("cpu", 0))
            rows = num_tokens if self.decoder.per_token_logits else num_rows
            if rows > self.logits.shape[0]:
                raise ValueError(f"the step needs {rows} logits rows, above the {self.logits.shape[0]} allocated")
            self._bind_output(n["logits"], self.logits.dtype, (rows, self.vocab), self.device_logits)
            run_options = self._run_options_for(graph_id)
        except Exception as error:
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        # The uploads run on the session's stream, so they are ordered before the run's kernels. The
        # next step refills the staging buffer only after this step's stream work is complete: the
        # synchronize after the logits copy below (with logits on the device, the engine's read /
        # sample, complete on return, on the same stream; after a failed run, the synchronize there).
        start = time.perf_counter_ns()
        try:
            if run_options is None:
                self.session.run_with_iobinding(self.binding)
            else:
                self.session.run_with_iobinding(self.binding, run_options)
        except Exception as error:  # ONNX Runtime raises its own exception types
            status, text = classify_failure(error), f"{type(error).__name__}: {error}"
            try:
                self.device.synchronize()
            except Exception as sync_error:
                text += f" (then synchronizing the device failed: {type(sync_error).__name__}: {sync_error})"
                status = STATUS_FATAL
            return status, text, 0, 0
        finally:
            self.session_run_ns += time.perf_counter_ns() - start
        if self.logits_on_device:
            return STATUS_OK, "", self.device_logits, rows
        try:
            self.device.download(self.logits.ctypes.data, self.device_logits, rows * self.vocab * self.logits.itemsize)
            self.device.synchronize()
        except Exception as error:
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        return STATUS_OK, "", self.logits.ctypes.data, rows


def load_decoder(names, executor=None):
    """Entry point of the model loader (OgaExtModelLoader): opens and validates the session
    (`executor`: see OnnxDecoder)."""
    return OnnxDecoder(names, executor)


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

    def close(self):
        """Called when the engine closes (close_engine): host memory goes with this object."""

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
