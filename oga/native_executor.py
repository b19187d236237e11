"""oga's native ONNX Runtime executor: selection, and the hand-over from the Python decoder.

The native executor (native_executor/, built as oga/_native_executor*.so) runs a decoder through
ONNX Runtime's C API, so a step never takes the GIL: Engine.run releases it around the core call,
and the Python executor (oga/onnx_executor.py) takes it back in every callback. It is experimental
and opt-in: OGA_EXECUTOR=native selects it, OGA_EXECUTOR=python (the default) keeps the Python
executor.

What runs natively: paged decoders on the CPU execution provider without fixed decoder state and
without a sliding-window ring (the standard-op and the fused graphs oga.models.build emits for CPU).
The model loader (_core.pyx `_onnx_load`) first validates the decoder with the Python executor
(onnx_executor.OnnxDecoder, the same checks and messages); `attach` then hands the resolved names and
geometry to the native library, which opens its own session and fills the executor table, and the
Python session is dropped. Every other decoder kind stays on the Python executor; why is logged at
debug level (logger "oga.native_executor") and recorded in `selections`. When the native library
cannot be used at all (it was not built, ONNX Runtime's shared library is missing, or the runtime's
C API is older than the executor needs) the decoder runs on the Python executor with a
RuntimeWarning that says why.

ONNX Runtime is loaded from the onnxruntime package's own shared library
(onnxruntime/capi/libonnxruntime.so.<version>); OGA_ONNXRUNTIME_LIBRARY names another.
"""
from __future__ import annotations

import ctypes
import glob
import logging
import os
import warnings
from dataclasses import dataclass

import numpy as np

from oga.extensions import extension_path

ENV = "OGA_EXECUTOR"
LIBRARY_ENV = "OGA_ONNXRUNTIME_LIBRARY"

_log = logging.getLogger("oga.native_executor")

# ONNX element types
_ELEMENT_TYPES = {np.dtype(np.float32): 1, np.dtype(np.float16): 10}


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


def requested() -> str:
    """The executor OGA_EXECUTOR asks for: "native" or "python" (the default; an unknown value warns)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "python"):
        return "python"
    if value == "native":
        return "native"
    warnings.warn(f"oga: {ENV}={os.environ[ENV]!r} is neither 'native' nor 'python'; using the Python executor.",
                  RuntimeWarning, stacklevel=3)
    return "python"


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
    try:
        import onnxruntime
    except ImportError as error:
        raise NativeExecutorUnavailable(f"the onnxruntime package cannot be imported: {error}") from error
    capi = os.path.join(os.path.dirname(onnxruntime.__file__), "capi")
    found = sorted(p for p in glob.glob(os.path.join(capi, "libonnxruntime.so*")) if os.path.isfile(p))
    if not found:
        raise NativeExecutorUnavailable(f"the onnxruntime package has no libonnxruntime.so in {capi}")
    return found[-1]


class DecoderSpec(ctypes.Structure):
    """ctypes mirror of OgaNativeDecoderSpec (native_executor/native_executor.h)."""
    _fields_ = [
        ("model_path", ctypes.c_char_p), ("ortops_library", ctypes.c_char_p), ("log_id", ctypes.c_char_p),
        ("intra_op_num_threads", ctypes.c_int32), ("inter_op_num_threads", ctypes.c_int32),
        ("input_ids", ctypes.c_char_p), ("position_ids", ctypes.c_char_p),
        ("cumulative_sequence_lengths", ctypes.c_char_p), ("past_sequence_lengths", ctypes.c_char_p),
        ("block_table", ctypes.c_char_p), ("attention_metadata", ctypes.c_char_p),
        ("logits_indices", ctypes.c_char_p), ("logits", ctypes.c_char_p),
        ("num_layers", ctypes.c_size_t),
        ("past_key_names", ctypes.POINTER(ctypes.c_char_p)), ("past_value_names", ctypes.POINTER(ctypes.c_char_p)),
        ("present_key_names", ctypes.POINTER(ctypes.c_char_p)),
        ("present_value_names", ctypes.POINTER(ctypes.c_char_p)),
        ("cache_element_type", ctypes.c_int32), ("block_size", ctypes.c_size_t), ("kv_heads", ctypes.c_size_t),
        ("head_size", ctypes.c_size_t),
        ("num_cache_tensors", ctypes.c_size_t), ("cache_tensor_names", ctypes.POINTER(ctypes.c_char_p)),
        ("cache_tensor_blocks", ctypes.POINTER(ctypes.c_int64)), ("configured_num_blocks", ctypes.c_size_t),
        ("logits_element_type", ctypes.c_int32), ("vocab_size", ctypes.c_size_t),
        ("per_token_logits", ctypes.c_int32),
    ]


class _ExecutorHead(ctypes.Structure):
    """The leading members of OgaExtModelExecutor (include/oga/oga_ext.h), up to model_data."""
    _fields_ = [("per_token_logits", ctypes.c_int32), ("max_block_table_columns", ctypes.c_size_t),
                ("bytes_per_block", ctypes.c_size_t), ("model_data", ctypes.c_void_p)]


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
        lib.OgaNativeDecoderSpecSize.restype = ctypes.c_size_t
        lib.OgaNativeExecutorApiVersion.restype = ctypes.c_uint32
        lib.OgaNativeRuntimeOpen.argtypes = [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
        lib.OgaNativeRuntimeOpen.restype = ctypes.c_int32
        lib.OgaNativeRuntimeVersion.restype = ctypes.c_char_p
        lib.OgaNativeExecutorCheckApi.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.OgaNativeExecutorCheckApi.restype = ctypes.c_int32
        lib.OgaNativeExecutorLoad.argtypes = [ctypes.POINTER(DecoderSpec), ctypes.c_void_p, ctypes.c_char_p,
                                              ctypes.c_size_t]
        lib.OgaNativeExecutorLoad.restype = ctypes.c_int32
        lib.OgaNativeExecutorDescribe.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.OgaNativeExecutorDescribe.restype = ctypes.c_size_t
        lib.OgaNativeModelRunNs.argtypes = [ctypes.c_void_p]
        lib.OgaNativeModelRunNs.restype = ctypes.c_uint64
        lib.OgaNativeModelBindCount.argtypes = [ctypes.c_void_p]
        lib.OgaNativeModelBindCount.restype = ctypes.c_uint64
        if lib.OgaNativeDecoderSpecSize() != ctypes.sizeof(DecoderSpec):
            raise NativeExecutorUnavailable(
                f"{path} was built with another OgaNativeDecoderSpec ({lib.OgaNativeDecoderSpecSize()} bytes, "
                f"oga/native_executor.py has {ctypes.sizeof(DecoderSpec)}): rebuild oga")
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


def unsupported_reason(decoder) -> str:
    """Why the native executor cannot run this validated decoder yet, or "" when it can."""
    if decoder.static:
        return "static-batching decoders (contiguous caches) run on the Python executor"
    if decoder.device is not None:
        return "decoders on a device (the CUDA execution provider or the device test path) run on the Python executor"
    if list(decoder.providers) != ["CPUExecutionProvider"]:
        return f"the session runs on {', '.join(decoder.providers)}; the native executor runs the CPU provider only"
    session_config = decoder.decoder_config.get("session_options", {}) or {}
    for entry in session_config.get("provider_options", []) or []:
        for name, values in entry.items():
            if name.lower() in ("cpu", "cpuexecutionprovider") and values:
                return "CPU provider options are not passed by the native executor yet"
    if decoder.fixed_states:
        return "decoders with fixed decoder state (hybrid models) run on the Python executor"
    if decoder.windowed_block_table:
        return "decoders with sliding-window ring layers run on the Python executor"
    if np.dtype(decoder.cache_dtype) not in _ELEMENT_TYPES or np.dtype(decoder.logits_dtype) not in _ELEMENT_TYPES:
        return "only float32 and float16 caches and logits run natively"
    return ""


def _strings(values):
    encoded = [os.fsencode(v) if isinstance(v, str) else v for v in values]
    return (ctypes.c_char_p * max(1, len(encoded)))(*encoded)


def _spec(decoder):
    """(DecoderSpec, the objects it points into, which must outlive the call)."""
    from . import ortops

    n = decoder.names
    session_config = decoder.decoder_config.get("session_options", {}) or {}
    keep = []

    def text(value):
        if value is None:
            return None
        encoded = value.encode("utf-8")
        keep.append(encoded)
        return encoded

    def names(values):
        array = _strings([v.encode("utf-8") for v in values])
        keep.append(array)
        return array

    block_size, kv_heads, head_size = decoder.cache_geometry
    cache_names = [name for _, name, _ in decoder.cache_tensors]
    cache_blocks = (ctypes.c_int64 * max(1, len(cache_names)))(
        *[meta.shape[0] if isinstance(meta.shape[0], int) else -1 for _, _, meta in decoder.cache_tensors])
    keep.append(cache_blocks)
    spec = DecoderSpec(
        model_path=text(decoder.path), ortops_library=os.fsencode(ortops.library_path()),
        log_id=text(str(session_config["log_id"])) if "log_id" in session_config else None,
        intra_op_num_threads=int(session_config.get("intra_op_num_threads", -1)),
        inter_op_num_threads=int(session_config.get("inter_op_num_threads", -1)),
        input_ids=text(n["input_ids"]),
        position_ids=text(n["position_ids"]) if decoder.has_position_ids else None,
        cumulative_sequence_lengths=text(n["cumulative_sequence_lengths"]),
        past_sequence_lengths=text(n["past_sequence_lengths"]), block_table=text(n["block_table"]),
        attention_metadata=text(n["attention_metadata"]) if decoder.has_attention_metadata else None,
        logits_indices=text(n["logits_indices"]) if decoder.has_logits_indices else None,
        logits=text(n["logits"]),
        num_layers=len(n["paged_layer_ids"]),
        past_key_names=names(n["past_key_names"]), past_value_names=names(n["past_value_names"]),
        present_key_names=names(n["present_key_names"]), present_value_names=names(n["present_value_names"]),
        cache_element_type=_ELEMENT_TYPES[np.dtype(decoder.cache_dtype)], block_size=block_size, kv_heads=kv_heads,
        head_size=head_size, num_cache_tensors=len(cache_names), cache_tensor_names=names(cache_names),
        cache_tensor_blocks=cache_blocks, configured_num_blocks=decoder._configured_num_blocks() or 0,
        logits_element_type=_ELEMENT_TYPES[np.dtype(decoder.logits_dtype)], vocab_size=n["vocab_size"],
        per_token_logits=1 if decoder.per_token_logits else 0)
    return spec, keep


def _fall_back(decoder, reason, warn):
    selections[decoder.path] = Selection("python", reason)
    if warn:
        warnings.warn(f"oga: the native executor cannot run {decoder.path} ({reason}); using the Python executor.",
                      RuntimeWarning, stacklevel=3)
    else:
        _log.debug("%s runs on the Python executor: %s", decoder.path, reason)
    return False


def attach(decoder, executor_address) -> bool:
    """Called by the model loader with a validated onnx_executor.OnnxDecoder and the address of the
    OgaExtModelExecutor it filled from it. When OGA_EXECUTOR asks for the native executor and it can
    run the decoder, the native library fills the table's callbacks and model_data, the decoder's
    Python session is dropped, and True is returned; otherwise the table is left alone (False)."""
    if requested() != "native":
        selections[decoder.path] = Selection("python", f"{ENV} selects the Python executor")
        return False
    reason = unsupported_reason(decoder)
    if reason:
        return _fall_back(decoder, reason, warn=False)
    try:
        open_runtime()
        lib = library()
        spec, keep = _spec(decoder)
        message = ctypes.create_string_buffer(4096)
        if lib.OgaNativeExecutorLoad(ctypes.byref(spec), ctypes.c_void_p(int(executor_address)), message,
                                     len(message)) != 0:
            raise NativeExecutorUnavailable(f"the native session could not be created: "
                                            f"{message.value.decode('utf-8', 'replace')}")
        del keep
    except NativeExecutorUnavailable as error:
        return _fall_back(decoder, str(error), warn=True)
    model_data = _ExecutorHead.from_address(int(executor_address)).model_data
    selections[decoder.path] = Selection("native", "", model_data or 0)
    decoder.session = None  # the native session replaces it
    _log.debug("%s runs on the native executor", decoder.path)
    return True


def describe(selection: Selection) -> list[tuple]:
    """Test support: (kind, name, ONNX element type, dims) of every input and output of the native
    session behind `selection` (kind "input" / "output", -1 for a symbolic dimension)."""
    lib = library()
    size = lib.OgaNativeExecutorDescribe(ctypes.c_void_p(selection.model_data), None, 0)
    text = ctypes.create_string_buffer(max(size, 4096))
    if lib.OgaNativeExecutorDescribe(ctypes.c_void_p(selection.model_data), text, len(text)) == 0:
        raise RuntimeError(text.value.decode())
    rows = []
    for line in text.value.decode().splitlines():
        kind, name, element, dims = (line.split(" ") + [""])[:4]
        rows.append((kind, name, int(element), tuple(int(d) for d in dims.split(",") if d)))
    return rows


def run_ns(selection: Selection) -> int:
    """Nanoseconds the native model's engines spent inside ONNX Runtime's run (model alive only)."""
    return int(library().OgaNativeModelRunNs(ctypes.c_void_p(selection.model_data)))


def bind_count(selection: Selection) -> int:
    """Inputs and outputs the native model's engines bound so far (model alive only)."""
    return int(library().OgaNativeModelBindCount(ctypes.c_void_p(selection.model_data)))
