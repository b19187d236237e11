"""oga's native ONNX Runtime executor: selection, the native session, and the hand-over from the
validated decoder.

The native executor (native_executor/, built as oga/_native_executor*.so) runs a decoder through
ONNX Runtime's C API, so a step never takes the GIL: Engine.run releases it around the core call,
whereas the Python executor (host.py, device_path.py, static.py) takes it back in every callback. It is the
default: OGA_EXECUTOR=python selects the Python executor instead (OGA_EXECUTOR=native, or unset,
the native one).

What runs natively: every decoder whose session runs on the CPU execution provider -- paged decoders
(standard-op and fused graphs, logits indices, per-token logits, float16 caches, quantized weights),
their sliding-window ring layers and fixed decoder state, and static-batching decoders. Decoders on
a device (the CUDA execution provider, or the CPU test path of oga.testing.device_path) and decoders
whose config passes CPU provider options stay on the Python executor; why is logged at debug level
(logger "oga.executor.native") and recorded in `selections`.

Loading (decoder.OnnxDecoder): `open_session` creates the decoder's session natively; the
decoder validates the graph against it (NativeSession offers the metadata interface of
onnxruntime.InferenceSession, so the checks and messages are the Python executor's); `attach` then
hands the resolved names and geometry to the native library, which fills the executor table and
owns the session from then on. Only one session is ever created. When the native library cannot be
used at all (it was not built, ONNX Runtime's shared library is missing, or the runtime's C API is
older than the executor needs) the decoder runs on the Python executor with a RuntimeWarning that
says why.

ONNX Runtime is loaded from the onnxruntime package's own shared library
(onnxruntime/capi/libonnxruntime.so.<version>); OGA_ONNXRUNTIME_LIBRARY names another.
"""
from __future__ import annotations

import ctypes
import glob
import json
import logging
import os
import warnings
from dataclasses import dataclass

import numpy as np

from oga.extensions import extension_path

ENV = "OGA_EXECUTOR"
LIBRARY_ENV = "OGA_ONNXRUNTIME_LIBRARY"

_log = logging.getLogger("oga.executor.native")

# ONNX element types of the tensors the executor binds
_ELEMENT_TYPES = {np.dtype(np.float32): 1, np.dtype(np.float16): 10, np.dtype(np.int32): 6, np.dtype(np.int64): 7}
# ONNX element type -> the type text onnxruntime's NodeArg.type shows
_TYPE_NAMES = {1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string",
               9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64", 14: "complex64", 15: "complex128",
               16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2", 20: "float8e5m2fnuz",
               21: "uint4", 22: "int4"}


@dataclass(frozen=True)
class Selection:
    """Which executor runs a decoder, and why. model_data: the native model (for the counters below)
    while the model lives, else 0."""
    executor: str  # "native" | "python"
    reason: str
    model_data: int = 0


# decoder file path -> Selection of its latest load
selections: dict[str, Selection] = {}


class NativeExecutorUnavailable(RuntimeError):
    """The native library or ONNX Runtime's shared library cannot be used."""


class NativeSessionError(RuntimeError):
    """ONNX Runtime refused to create the session; the text is what onnxruntime's Python binding
    shows for the same failure ("[ONNXRuntimeError] : 1 : FAIL : ...")."""


def requested() -> str:
    """The executor OGA_EXECUTOR asks for: "native" (the default) or "python" (an unknown value warns
    and selects the native executor)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "native"):
        return "native"
    if value == "python":
        return "python"
    warnings.warn(f"oga: {ENV}={os.environ[ENV]!r} is neither 'native' nor 'python'; using the native executor.",
                  RuntimeWarning, stacklevel=3)
    return "native"


def library_path() -> str:
    """The native executor library (oga/_native_executor*.so) along the package path."""
    path = extension_path("_native_executor")
    if path is not None:
        return path
    raise NativeExecutorUnavailable("oga's native executor library (oga/_native_executor) is missing: rebuild oga "
                                    "(python setup.py build_ext --inplace, or pip install .)")


def onnxruntime_library_path() -> str:
    """ONNX Runtime's shared library: OGA_ONNXRUNTIME_LIBRARY, else the onnxruntime package's."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return override
    from oga.onnxruntime_import import import_onnxruntime

    try:
        onnxruntime = import_onnxruntime()
    except ImportError as error:
        raise NativeExecutorUnavailable(f"the onnxruntime package cannot be imported: {error}") from error
    capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
    found = sorted(p for p in glob.glob(os.path.join(capi, "libonnxruntime.so*")) if os.path.isfile(p))
    if not found:
        raise NativeExecutorUnavailable(f"the onnxruntime package has no libonnxruntime.so in {capi}")
    return found[-1]


# -- ctypes mirrors of native_executor/native_executor.h -------------------------------------------

class SessionSpec(ctypes.Structure):
    _fields_ = [("model_path", ctypes.c_char_p), ("ortops_library", ctypes.c_char_p), ("log_id", ctypes.c_char_p),
                ("intra_op_num_threads", ctypes.c_int32), ("inter_op_num_threads", ctypes.c_int32)]


class FixedStateSpec(ctypes.Structure):
    _fields_ = [("input", ctypes.c_char_p), ("output", ctypes.c_char_p), ("capture", ctypes.c_char_p),
                ("element_type", ctypes.c_int32), ("row_rank", ctypes.c_size_t),
                ("row_dims", ctypes.POINTER(ctypes.c_int64)), ("row_bytes", ctypes.c_size_t)]


class CacheTensorSpec(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dims", ctypes.c_int64 * 4), ("ring", ctypes.c_int32)]


class DecoderSpec(ctypes.Structure):
    _fields_ = [
        ("static_batching", ctypes.c_int32),
        ("input_ids", ctypes.c_char_p), ("position_ids", ctypes.c_char_p),
        ("cumulative_sequence_lengths", ctypes.c_char_p), ("past_sequence_lengths", ctypes.c_char_p),
        ("block_table", ctypes.c_char_p), ("block_table_windowed", ctypes.c_char_p),
        ("attention_metadata", ctypes.c_char_p), ("logits_indices", ctypes.c_char_p),
        ("attention_mask", ctypes.c_char_p), ("logits", ctypes.c_char_p),
        ("num_layers", ctypes.c_size_t), ("layer_ids", ctypes.POINTER(ctypes.c_int32)),
        ("past_key_names", ctypes.POINTER(ctypes.c_char_p)), ("past_value_names", ctypes.POINTER(ctypes.c_char_p)),
        ("present_key_names", ctypes.POINTER(ctypes.c_char_p)),
        ("present_value_names", ctypes.POINTER(ctypes.c_char_p)),
        ("ring_layers", ctypes.POINTER(ctypes.c_int32)),
        ("cache_element_type", ctypes.c_int32), ("block_size", ctypes.c_size_t), ("kv_heads", ctypes.c_size_t),
        ("head_size", ctypes.c_size_t),
        ("num_cache_tensors", ctypes.c_size_t), ("cache_tensors", ctypes.POINTER(CacheTensorSpec)),
        ("configured_num_blocks", ctypes.c_size_t),
        ("logits_element_type", ctypes.c_int32), ("vocab_size", ctypes.c_size_t),
        ("per_token_logits", ctypes.c_int32),
        ("num_fixed_states", ctypes.c_size_t), ("fixed_states", ctypes.POINTER(FixedStateSpec)),
        ("logits_block_maxima", ctypes.c_char_p),
        ("static_rows_alone", ctypes.c_int32),
    ]


_library = None
_opened = {}  # (ORT library path, API version) -> None (open) | error text


def library():
    """The native executor library loaded with ctypes, typed (raises NativeExecutorUnavailable)."""
    global _library
    if _library is None:
        path = library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:
            raise NativeExecutorUnavailable(f"cannot load {path}: {error}") from error
        char_p, size_t, void_p = ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p
        for name in ("OgaNativeDecoderSpecSize", "OgaNativeFixedStateSize", "OgaNativeCacheTensorSize"):
            getattr(lib, name).restype = size_t
        lib.OgaNativeExecutorApiVersion.restype = ctypes.c_uint32
        lib.OgaNativeRuntimeOpen.argtypes = [char_p, ctypes.c_uint32, char_p, size_t]
        lib.OgaNativeRuntimeOpen.restype = ctypes.c_int32
        lib.OgaNativeRuntimeVersion.restype = char_p
        lib.OgaNativeExecutorCheckApi.argtypes = [char_p, size_t]
        lib.OgaNativeExecutorCheckApi.restype = ctypes.c_int32
        lib.OgaNativeSessionOpen.argtypes = [ctypes.POINTER(SessionSpec), ctypes.POINTER(void_p), char_p, size_t]
        lib.OgaNativeSessionOpen.restype = ctypes.c_int32
        lib.OgaNativeSessionRelease.argtypes = [void_p]
        lib.OgaNativeSessionRelease.restype = None
        lib.OgaNativeSessionDescribe.argtypes = [void_p, char_p, size_t]
        lib.OgaNativeSessionDescribe.restype = size_t
        lib.OgaNativeExecutorLoad.argtypes = [void_p, ctypes.POINTER(DecoderSpec), void_p, char_p, size_t]
        lib.OgaNativeExecutorLoad.restype = ctypes.c_int32
        lib.OgaNativeModelRunNs.argtypes = [void_p]
        lib.OgaNativeModelRunNs.restype = ctypes.c_uint64
        lib.OgaNativeModelBindCount.argtypes = [void_p]
        lib.OgaNativeModelBindCount.restype = ctypes.c_uint64
        for name, mirror in (("OgaNativeDecoderSpecSize", DecoderSpec), ("OgaNativeFixedStateSize", FixedStateSpec),
                             ("OgaNativeCacheTensorSize", CacheTensorSpec)):
            if getattr(lib, name)() != ctypes.sizeof(mirror):
                raise NativeExecutorUnavailable(
                    f"{path} was built with another {mirror.__name__} layout ({getattr(lib, name)()} bytes, "
                    f"oga/executor/native.py has {ctypes.sizeof(mirror)}): rebuild oga")
        _library = lib
    return _library


def required_api_version() -> int:
    """The ONNX Runtime C API version the native executor asks for."""
    return int(library().OgaNativeExecutorApiVersion())


def open_runtime() -> str:
    """Opens ONNX Runtime for the native executor (once per process) and checks the C API entries it
    declares; returns the runtime's version string (raises NativeExecutorUnavailable)."""
    lib = library()
    path = onnxruntime_library_path()
    version = required_api_version()
    key = (path, version)
    if key not in _opened:
        message = ctypes.create_string_buffer(2048)
        if lib.OgaNativeRuntimeOpen(os.fsencode(path), version, message, len(message)) != 0:
            _opened[key] = message.value.decode("utf-8", "replace")
        elif lib.OgaNativeExecutorCheckApi(message, len(message)) != 0:
            _opened[key] = message.value.decode("utf-8", "replace")
        else:
            _opened[key] = None
    if _opened[key] is not None:
        raise NativeExecutorUnavailable(_opened[key])
    return lib.OgaNativeRuntimeVersion().decode()


# -- the native session ----------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output as onnxruntime's NodeArg shows it: `type` such as "tensor(float)",
    `shape` with an int per fixed dimension, the name of a named symbolic one, None otherwise."""
    name: str
    type: str
    shape: list


def _describe(handle) -> list[tuple[str, TensorInfo]]:
    lib = library()
    size = lib.OgaNativeSessionDescribe(ctypes.c_void_p(handle), None, 0)
    text = ctypes.create_string_buffer(max(size, 4096))
    if size == 0 or lib.OgaNativeSessionDescribe(ctypes.c_void_p(handle), text, len(text)) == 0:
        raise RuntimeError(f"cannot describe the native session: {text.value.decode('utf-8', 'replace')}")
    rows = []
    for entry in json.loads(text.value.decode("utf-8")):
        element = entry["type"]
        type_name = "non-tensor" if element == 0 else f"tensor({_TYPE_NAMES.get(element, f'type {element}')})"
        rows.append((entry["kind"], TensorInfo(entry["name"], type_name, list(entry["dims"]))))
    return rows


class NativeSession:
    """A decoder's session created by the native library, with the metadata methods of
    onnxruntime.InferenceSession that OnnxDecoder validates against. Owned here until `attach` hands
    it to the executor table (then the model releases it); `close` frees it before that."""

    def __init__(self, path, session_config):
        from .. import ortops

        lib = library()
        keep = [os.fsencode(path)]
        spec = SessionSpec(
            model_path=keep[0], ortops_library=os.fsencode(ortops.library_path()),
            log_id=str(session_config["log_id"]).encode("utf-8") if "log_id" in session_config else None,
            intra_op_num_threads=int(session_config.get("intra_op_num_threads", -1)),
            inter_op_num_threads=int(session_config.get("inter_op_num_threads", -1)))
        handle = ctypes.c_void_p()
        message = ctypes.create_string_buffer(8192)
        if lib.OgaNativeSessionOpen(ctypes.byref(spec), ctypes.byref(handle), message, len(message)) != 0:
            raise NativeSessionError(message.value.decode("utf-8", "replace"))
        self.handle = handle.value
        described = _describe(self.handle)
        self._inputs = [t for kind, t in described if kind == "input"]
        self._outputs = [t for kind, t in described if kind == "output"]

    def get_inputs(self):
        return list(self._inputs)

    def get_outputs(self):
        return list(self._outputs)

    def get_providers(self):
        return ["CPUExecutionProvider"]

    def close(self):
        """Frees the session unless the executor table owns it; idempotent."""
        handle, self.handle = self.handle, None
        if handle:
            library().OgaNativeSessionRelease(ctypes.c_void_p(handle))

    def _hand_over(self):
        """The handle, now owned by the executor table."""
        handle, self.handle = self.handle, None
        return handle

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def python_session_reason(executor, chosen, device_path):
    """Why a decoder's session is not created natively ("" when it is). `chosen`: the (provider,
    options) pairs the session would get (ONNX Runtime's CPU provider takes no options: it ignores
    them on either executor); `device_path`: whether the decoder takes the device path."""
    if executor != "native":
        return f"{ENV} selects the Python executor"
    if device_path or [p for p, _ in chosen] != ["CPUExecutionProvider"]:
        return ("decoders on a device (the CUDA execution provider or the device test path) run on the Python "
                "executor")
    return ""


def open_session(path, session_config, reason):
    """The decoder's NativeSession, or None when it runs on the Python executor: `reason` (from
    python_session_reason) says why, or the native library cannot be used (a RuntimeWarning says
    why). Raises NativeSessionError when ONNX Runtime refuses the model itself."""
    if reason:
        return _fall_back(path, reason, warn=False)
    try:
        open_runtime()
        return NativeSession(path, session_config)
    except NativeExecutorUnavailable as error:
        return _fall_back(path, str(error), warn=True)


def _fall_back(path, reason, warn):
    selections[path] = Selection("python", reason)
    if warn:
        warnings.warn(f"oga: the native executor cannot run {path} ({reason}); using the Python executor.",
                      RuntimeWarning, stacklevel=4)
    else:
        _log.debug("%s runs on the Python executor: %s", path, reason)
    return None


# -- the hand-over -----------------------------------------------------------------------------------

def _dims(shape, rank):
    return [d if isinstance(d, int) else -1 for d in shape] + [-1] * (rank - len(shape))


def _spec(decoder):
    """(DecoderSpec, the objects it points into, which must outlive the call)."""
    n = decoder.names
    keep = []

    def text(value):
        if value is None:
            return None
        encoded = value.encode("utf-8")
        keep.append(encoded)
        return encoded

    def array(ctype, values):
        result = (ctype * max(1, len(values)))(*values)
        keep.append(result)
        return result

    static = bool(decoder.static)
    layers = list(n["paged_layer_ids"]) if not static else list(range(len(n["past_key_names"])))
    if static:
        kv_heads, head_size = decoder.cache_geometry
        block_size = 0
        tensors = [(False, name, meta) for name, meta in decoder.cache_tensors]
    else:
        block_size, kv_heads, head_size = decoder.cache_geometry
        tensors = [(layer in decoder.ring_layers, name, meta) for layer, name, meta in decoder.cache_tensors]
    cache_tensors = array(CacheTensorSpec, [
        CacheTensorSpec(name=text(name), dims=(ctypes.c_int64 * 4)(*_dims(meta.shape, 4)[:4]), ring=1 if ring else 0)
        for ring, name, meta in tensors])
    fixed = []
    for t in decoder.fixed_states:
        dims = array(ctypes.c_int64, list(t.row_shape))
        fixed.append(FixedStateSpec(input=text(t.input_name), output=text(t.output_name),
                                    capture=text(t.capture_name), element_type=_ELEMENT_TYPES[np.dtype(t.dtype)],
                                    row_rank=len(t.row_shape), row_dims=dims, row_bytes=t.row_bytes))
    fixed_states = array(FixedStateSpec, fixed)

    def optional(key, present):
        return text(n[key]) if present else None

    spec = DecoderSpec(
        static_batching=1 if static else 0,
        input_ids=text(n["input_ids"]),
        position_ids=optional("position_ids", decoder.has_position_ids),
        cumulative_sequence_lengths=optional("cumulative_sequence_lengths", not static),
        past_sequence_lengths=optional("past_sequence_lengths", not static),
        block_table=optional("block_table", not static),
        block_table_windowed=optional("block_table_windowed", not static and decoder.windowed_block_table),
        attention_metadata=optional("attention_metadata", not static and decoder.has_attention_metadata),
        logits_indices=optional("logits_indices", not static and decoder.has_logits_indices),
        attention_mask=optional("attention_mask", static),
        logits=text(n["logits"]),
        num_layers=len(layers), layer_ids=array(ctypes.c_int32, layers),
        past_key_names=array(ctypes.c_char_p, [text(v) for v in n["past_key_names"]]),
        past_value_names=array(ctypes.c_char_p, [text(v) for v in n["past_value_names"]]),
        present_key_names=array(ctypes.c_char_p, [text(v) for v in n["present_key_names"]]),
        present_value_names=array(ctypes.c_char_p, [text(v) for v in n["present_value_names"]]),
        ring_layers=array(ctypes.c_int32, [1 if layer in decoder.ring_layers else 0 for layer in layers]),
        cache_element_type=_ELEMENT_TYPES[np.dtype(decoder.cache_dtype)], block_size=block_size, kv_heads=kv_heads,
        head_size=head_size, num_cache_tensors=len(tensors), cache_tensors=cache_tensors,
        configured_num_blocks=decoder._configured_num_blocks() or 0,
        logits_element_type=_ELEMENT_TYPES[np.dtype(decoder.logits_dtype)], vocab_size=n["vocab_size"],
        per_token_logits=1 if decoder.per_token_logits else 0,
        num_fixed_states=len(fixed), fixed_states=fixed_states,
        logits_block_maxima=text(decoder.block_maxima) if not static and decoder.block_maxima else None,
        static_rows_alone=1 if static and decoder.static_rows_alone else 0)
    return spec, keep


def attach(decoder, executor_address) -> bool:
    """Called by the model loader with a validated decoder.OnnxDecoder and the address of the
    OgaExtModelExecutor it filled from it. When the decoder's session is native, the native library
    takes it and fills the table's callbacks, model_data and fixed-state row sizes, and True is
    returned; otherwise the table is left alone (False)."""
    session = decoder.session
    if not isinstance(session, NativeSession):
        return False
    if decoder.static and not decoder.cache_tensors:
        # A paged hybrid graph configured without dynamic batching (decoder._validate): og.Engine
        # refuses it before opening it, so no executor ever runs it; the table stays the Python one.
        selections[decoder.path] = Selection("python", "a static-batching decoder with fixed state groups that is "
                                                       "not a contiguous-cache graph never runs (og.Engine refuses it)")
        return False
    lib = library()
    spec, keep = _spec(decoder)
    message = ctypes.create_string_buffer(4096)
    if lib.OgaNativeExecutorLoad(ctypes.c_void_p(session.handle), ctypes.byref(spec),
                                 ctypes.c_void_p(int(executor_address)), message, len(message)) != 0:
        raise RuntimeError(f"{decoder.path}: the native executor cannot run this decoder: "
                           f"{message.value.decode('utf-8', 'replace')}")
    del keep
    model_data = session._hand_over()
    selections[decoder.path] = Selection("native", "", model_data)
    _log.debug("%s runs on the native executor", decoder.path)
    return True


def describe(selection: Selection) -> list[tuple]:
    """Test support: (kind, TensorInfo) of every input and output of the native session behind
    `selection` (kind "input" / "output")."""
    return _describe(selection.model_data)


def run_ns(selection: Selection) -> int:
    """Nanoseconds the native model's engines spent inside ONNX Runtime's run (model alive only)."""
    return int(library().OgaNativeModelRunNs(ctypes.c_void_p(selection.model_data)))


def bind_count(selection: Selection) -> int:
    """Inputs and outputs the native model's engines bound so far (model alive only)."""
    return int(library().OgaNativeModelBindCount(ctypes.c_void_p(selection.model_data)))
