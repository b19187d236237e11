"""Module-level functions of onnxruntime-genai 0.18 that engine applications call at start-up.

Execution-provider availability is what the installed ``onnxruntime`` offers (False for every
provider when onnxruntime is not installed); log options and the log callback are stored and used
by :func:`log`; oga sends no telemetry, so the telemetry switches only record the setting.
"""
import operator as _operator
import sys as _sys
import threading as _threading

__all__ = [
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_current_gpu_device_id",
    "is_cuda_available",
    "is_dml_available",
    "is_openvino_available",
    "is_qnn_available",
    "is_rocm_available",
    "is_webgpu_available",
    "register_execution_provider_library",
    "set_current_gpu_device_id",
    "set_log_callback",
    "set_log_options",
    "unregister_execution_provider_library",
]

# ---- execution providers ----------------------------------------------------------------------


def _onnxruntime():
    from .onnxruntime_import import import_onnxruntime

    try:
        return import_onnxruntime()
    except ImportError:
        return None


def _provider_available(name):
    ort = _onnxruntime()
    return ort is not None and name in ort.get_available_providers()


def is_cuda_available() -> bool:
    """True when onnxruntime offers CUDAExecutionProvider (onnxruntime-gpu is installed)."""
    return _provider_available("CUDAExecutionProvider")


def is_dml_available() -> bool:
    """True when onnxruntime offers DmlExecutionProvider."""
    return _provider_available("DmlExecutionProvider")


def is_rocm_available() -> bool:
    """True when onnxruntime offers ROCMExecutionProvider (pre-0.18 name, kept for old code)."""
    return _provider_available("ROCMExecutionProvider")


def is_openvino_available() -> bool:
    """True when onnxruntime offers OpenVINOExecutionProvider."""
    return _provider_available("OpenVINOExecutionProvider")


def is_qnn_available() -> bool:
    """True when onnxruntime offers QNNExecutionProvider."""
    return _provider_available("QNNExecutionProvider")


def is_webgpu_available() -> bool:
    """True when onnxruntime offers WebGpuExecutionProvider."""
    return _provider_available("WebGpuExecutionProvider")


def register_execution_provider_library(registration_name: str, library_path: str) -> None:
    """Registers a plug-in execution provider library with onnxruntime (forwarded to
    ``onnxruntime.register_execution_provider_library``)."""
    ort = _onnxruntime()
    if ort is None or not hasattr(ort, "register_execution_provider_library"):
        raise RuntimeError("register_execution_provider_library: the installed onnxruntime "
                           "does not support execution provider libraries")
    try:
        ort.register_execution_provider_library(registration_name, library_path)
    except Exception as e:
        raise RuntimeError(f"Failed to register execution provider library '{registration_name}'. {e}") from None


def unregister_execution_provider_library(registration_name: str) -> None:
    """Unregisters a library registered with register_execution_provider_library."""
    ort = _onnxruntime()
    if ort is None or not hasattr(ort, "unregister_execution_provider_library"):
        raise RuntimeError("unregister_execution_provider_library: the installed onnxruntime "
                           "does not support execution provider libraries")
    try:
        ort.unregister_execution_provider_library(registration_name)
    except Exception as e:
        raise RuntimeError(f"Execution provider library: {registration_name} was not registered. ({e})") from None


# ---- GPU device -------------------------------------------------------------------------------

_current_gpu_device_id = 0


def set_current_gpu_device_id(device_id: int) -> None:
    """Selects the GPU that models created afterwards use (the CUDA provider's ``device_id``).
    0.18 crashes without a CUDA build; oga only records the id."""
    global _current_gpu_device_id
    device_id = _operator.index(device_id)
    if device_id < 0:
        raise ValueError("set_current_gpu_device_id: device id must be non-negative")
    _current_gpu_device_id = device_id


def get_current_gpu_device_id() -> int:
    """The id set by set_current_gpu_device_id (0 by default)."""
    return _current_gpu_device_id


# ---- logging ----------------------------------------------------------------------------------

# 0.18's option names: all bool except `filename`.
_BOOL_LOG_OPTIONS = (
    "enabled", "ansi_tags", "warning", "generate_next_token", "append_next_tokens", "hit_eos",
    "hit_max_length", "model_input_values", "model_output_shapes", "model_output_values",
    "model_logits", "ort_lib", "value_stats",
)
_STRING_LOG_OPTIONS = ("filename",)

_log_lock = _threading.Lock()
_log_options = {name: False for name in _BOOL_LOG_OPTIONS}
_log_options.update(warning=True, ansi_tags=True, filename="")
_log_callback = None


def set_log_options(**options) -> None:
    """set_log_options(**options) -> None, with 0.18's option names: bool options ``enabled``,
    ``warning``, ``ansi_tags``, ``generate_next_token``, ``append_next_tokens``, ``hit_eos``,
    ``hit_max_length``, ``model_input_values``, ``model_output_shapes``, ``model_output_values``,
    ``model_logits``, ``ort_lib``, ``value_stats``; string option ``filename`` (log to that file
    instead of stderr; empty string: stderr). All options are checked before any is applied."""
    for name, value in options.items():
        if name in _BOOL_LOG_OPTIONS:
            if not isinstance(value, bool):
                raise RuntimeError(f"Unknown log option type, can be bool/string:{name}")
        elif name in _STRING_LOG_OPTIONS:
            if not isinstance(value, str):
                raise RuntimeError(f"Unknown log option type, can be bool/string:{name}")
        else:
            raise RuntimeError(f"Unknown log option: {name}")
    with _log_lock:
        _log_options.update(options)


def set_log_callback(callback) -> None:
    """set_log_callback(callback: Callable[[str], None] | None) -> None: log lines go to the
    callback instead of stderr / the log file; None restores the default."""
    global _log_callback
    if callback is not None and not callable(callback):
        raise TypeError("set_log_callback(): expected a callable or None")
    with _log_lock:
        _log_callback = callback


def log_options() -> dict:
    """oga addition: a copy of the current log options."""
    with _log_lock:
        return dict(_log_options)


def log(option: str, message: str) -> None:
    """oga addition: writes one log line when logging is ``enabled`` and ``option`` is on."""
    with _log_lock:
        if not (_log_options["enabled"] and _log_options.get(option)):
            return
        callback, filename = _log_callback, _log_options["filename"]
    line = f"{option}: {message}"
    if callback is not None:
        callback(line)
    elif filename:
        with open(filename, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    else:
        print(line, file=_sys.stderr)


# ---- telemetry --------------------------------------------------------------------------------

_telemetry_enabled = False


def disable_telemetry_events() -> None:
    """oga sends no telemetry; the call records the setting and returns None, as 0.18's does."""
    global _telemetry_enabled
    _telemetry_enabled = False


def enable_telemetry_events() -> None:
    """oga sends no telemetry; the call records the setting and returns None."""
    global _telemetry_enabled
    _telemetry_enabled = True
