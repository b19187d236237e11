"""A decoder's ONNX Runtime session and its validation: the model-level half of the executor.

OnnxDecoder opens the session for the decoder the core resolved (OgaExtDecoderNames: every tensor
name, the state groups and the sizes, so nothing here reads genai_config.json), natively when the
native executor runs it (oga/executor/native.py: one session, created by the native library, whose
metadata is validated here), and checks the graph against the configuration: every named input and
output, their types and ranks, the paged caches' geometry ([blocks, block_size, kv_heads, head
width], one type), the logits, and the optional inputs the graph may declare (position_ids,
attention_metadata, logits_indices, block_table_windowed). Errors are ModelLoadError naming the file,
the tensor and what was expected. open_engine then returns the per-engine executor: host.py on the CPU
provider, device_path.py on a device, static.py for static-batching decoders.

Fixed decoder state (hybrid models; the seed's "Fixed request-state pools"): the core resolves the
fixed_conv / fixed_recurrent bindings of model.decoder.state_groups (names expanded from the
templates, OGA's defaults when absent); every input/output pair is validated here (both present, one
dtype, identical statically known per-row geometry, a dynamic batch axis 0) and exposed as
`fixed_states` (FixedStateTensor, in group then layer order). The engine owns the state memory.

Per-token fixed state capture (draft verification): when only a prefix of a row's draft tokens is
accepted, the engine must commit the state after the last accepted token, not the one after the
row's last packed token. oga's convention: a decoder may give every fixed state output X a
companion output named X + ".per_token" (e.g. present.0.conv_state.per_token) of X's dtype and
shape [num_tokens, *row_shape], row i holding the state of token i's row after token i. It is
accepted only for every fixed tensor or none (ModelLoadError otherwise), recorded as
FixedStateTensor.capture_name, and sets `fixed_state_capture`.

Devices (oga/device.py): when ONNX Runtime puts the session on CUDAExecutionProvider, the decoder
opens `oga.device.CudaDevice(device_id)` before creating the session and passes the device's stream
as the provider's `user_compute_stream`, so ONNX Runtime's kernels and the executor's copies share
one stream, and hands the core its `device_ops` (oga.device_ops.DeviceOps over that device). When the
config's cuda provider options set enable_cuda_graph, the decoder declares
OgaExtModelExecutor.cuda_graph. Tests run the device path on the CPU provider with
oga.device.HostDevice (oga.testing.device_path, through set_cpu_device_factory).
"""
import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from .contract import CAPTURE_SUFFIX, LOGITS_BLOCK, LOGITS_BLOCK_MAXIMA, ModelLoadError
from .device_path import DeviceOnnxEngineExecutor
from .host import OnnxEngineExecutor
from .providers import CUDA, session_providers
from .static import StaticOnnxEngineExecutor

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}
_CACHE_TYPES = ("tensor(float)", "tensor(float16)")
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
    from .. import device as device_module
    from ..cuda_kernels import CudaUnavailable

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
        from .. import cuda_kernels
    except ImportError:
        return ""
    available, reason = cuda_kernels.cuda_status()
    return "" if available else reason


class OnnxDecoder:
    """Model-level state: the session and the validated graph signature."""

    def __init__(self, names, executor=None):
        """`executor`: "native" or "python" as the model loader selected it (native.requested);
        None (tests driving this executor directly): a Python session, recorded nowhere."""
        from ..onnxruntime_import import import_onnxruntime

        ort = import_onnxruntime()
        self.names = names
        self.path = os.path.join(names["model_directory"], names["decoder_filename"])
        if not os.path.isfile(self.path):
            raise ModelLoadError(f"The decoder file {self.path} does not exist (model.decoder.filename).")
        options = ort.SessionOptions()
        # oga's own operators (the fused CPU graphs' paged attention), on every session
        from .. import ortops
        ortops.register(options)
        # ONNX Runtime's intra-op threads spin-wait after a run by default, holding the cores the
        # engine's token selection (RowWorkers) needs right then; they still spin inside a run.
        options.add_session_config_entry("session.force_spinning_stop", "1")
        session_config = names["session_options"]
        if "log_id" in session_config:
            options.logid = str(session_config["log_id"])
        if "intra_op_num_threads" in session_config:
            options.intra_op_num_threads = int(session_config["intra_op_num_threads"])
        if "inter_op_num_threads" in session_config:
            options.inter_op_num_threads = int(session_config["inter_op_num_threads"])
        # The providers as 0.18 checks them (a cuda entry without a usable CUDA fails the load); on
        # the device test path a cuda entry stands for the CPU stand-in device, and is dropped here.
        providers, provider_options = session_providers(session_config.get("provider_options"),
                                                        lambda: cuda_unavailable_reason(ort),
                                                        cuda_stand_in=_cpu_device_factory is not None)
        wants_cuda = CUDA in providers
        cuda_reason = cuda_unavailable_reason(ort) if wants_cuda else ""
        chosen = [(p, o) for p, o in zip(providers, provider_options) if not (p == CUDA and cuda_reason)]
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
        """The decoder's session created by the native executor (native.py), or None
        when the Python executor runs it (the reason recorded there)."""
        if executor is None:
            return None
        from . import native

        device_path = self.device is not None or _cpu_device_factory is not None
        reason = native.python_session_reason(executor, chosen, device_path)
        return native.open_session(self.path, session_config, reason)

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
            from ..device_ops import DeviceOps

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
        self.static_rows_alone = False
        if self.static:
            input_ids = self.inputs.get(n["input_ids"])
            if n["fixed_states"] and input_ids is not None and len(input_ids.shape) == 1:
                # A paged hybrid graph (packed input_ids) configured without engine.dynamic_batching:
                # as 0.18, the model loads and og.Engine refuses it ("Fixed decoder state groups
                # require engine.dynamic_batching") before it opens this decoder; nothing runs it.
                self.per_token_logits = self.windowed_block_table = self.has_position_ids = False
                self.ring_layers = frozenset()
                self.bytes_per_block = 0
                return
            # A contiguous-cache graph with fixed state (OGA's CPU build of LFM2: conv layers with
            # past/present conv state): as 0.18, og.Engine refuses it and og.Generator runs it; the
            # static executor keeps the state per row.
            self._validate_static()
            self._validate_fixed_states()
            # Padding must not reach a conv layer's state, nor ONNX Runtime's windowed attention
            # (GroupQueryAttention with sliding_window_cache fails a right-padded prefill: "seqlens_k[0]
            # = 6 is too small for sequence_length 23"): a new batch's rows of different lengths then
            # prefill alone (static.py).
            self.static_rows_alone = bool(self.fixed_states) or bool(n["sliding_window_layers"])
            if any(t.capture_name for t in self.fixed_states):
                raise ModelLoadError(f"{self.path}: per-token fixed state outputs ('{CAPTURE_SUFFIX}') serve draft "
                                     "verification on the dynamic path; a static-batching decoder cannot have them.")
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
        self._validate_block_maxima()
        self._validate_caches()
        self._validate_fixed_states()

    def _validate_block_maxima(self):
        """oga's LM head output beside float32 logits (contract.LOGITS_BLOCK_MAXIMA), when the graph
        declares it: block_maxima is its name, or "" without it."""
        self.block_maxima = ""
        if LOGITS_BLOCK_MAXIMA not in self.outputs:
            return
        meta = self._check(self.outputs, LOGITS_BLOCK_MAXIMA, ("tensor(float)",), 2, "output")
        blocks = -(-self.names["vocab_size"] // LOGITS_BLOCK)
        if isinstance(meta.shape[1], int) and meta.shape[1] != blocks:
            self._fail(LOGITS_BLOCK_MAXIMA, f"{blocks} columns (one per {LOGITS_BLOCK} logits)",
                       f"has shape {meta.shape}")
        if self.logits_dtype != np.float32:
            self._fail(LOGITS_BLOCK_MAXIMA, "float32 logits beside it", f"is beside {self.logits_dtype.__name__} logits")
        self.block_maxima = LOGITS_BLOCK_MAXIMA

    def _validate_fixed_states(self):
        """The fixed_conv / fixed_recurrent bindings the core resolved from model.decoder.state_groups
        (the seed's "Fixed request-state pools"), each checked against the graph."""
        tensors = [self._fixed_tensor(kind, layer, input_name, output_name)
                   for kind, layer, input_name, output_name in self.names["fixed_states"]]
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
        layers = n["sliding_window_layers"]
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
        heads = self.names["num_key_value_heads"] or None
        if heads is not None:
            return heads, f"model.decoder.num_key_value_heads is {heads}"
        heads = first_meta.shape[axis]
        if not isinstance(heads, int) or heads <= 0:
            raise ModelLoadError(f"{self.path}: {first} dimension {axis} (the KV heads) is {heads!r} in the graph, and "
                                 "model.decoder.num_key_value_heads is not set, so the engine cannot size the KV cache.")
        return heads, f"the KV cache has {heads} KV heads (dimension {axis} of {first})"

    def _configured_num_blocks(self):
        """engine.dynamic_batching.num_blocks of the effective config, or None (automatic sizing)."""
        return self.names["num_blocks"] or None

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
        # RoPE outside attention (HunYuan: q/k norm after RoPE): [batch, sequence] positions, which
        # the core packs with every static step.
        self.has_position_ids = n["position_ids"] in self.inputs
        if self.has_position_ids:
            self._check(self.inputs, n["position_ids"], ("tensor(int64)",), 2, "input")
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
            head_size = self.names["head_size"] or None
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


def load_decoder(names, executor=None):
    """Entry point of the model loader (OgaExtModelLoader): opens and validates the session
    (`executor`: see OnnxDecoder)."""
    return OnnxDecoder(names, executor)
