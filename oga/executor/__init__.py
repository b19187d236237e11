"""The ONNX Runtime model executor: runs a decoder for the engine core.

The core never runs a model itself; it hands each packed step to an executor through the callback
table of include/oga/oga_ext.h (OgaExtModelExecutor). The model loader (the _core.pyx trampoline
registered at import) calls `load_decoder` with the decoder the core resolved (OgaExtDecoderNames)
and then `native.attach`; the pieces:

- decoder.py: OnnxDecoder, the session and its validation against the configuration;
- native.py: the native executor (C++ over ONNX Runtime's C API, the default for decoders on the CPU
  provider): selection, its session, and the hand-over of the validated decoder;
- host.py, device_path.py, static.py: the Python executor's per-engine state on the CPU provider, on
  a device, and for static-batching decoders (OGA_EXECUTOR=python, and decoders on a device);
- contract.py: the status and logits codes, failure classification, ModelLoadError.
"""
from .contract import (CAPTURE_SUFFIX, LOGITS_FLOAT16, LOGITS_FLOAT32, STATUS_CAPACITY_EXCEEDED, STATUS_FATAL,
                       STATUS_OK, ModelLoadError, classify_failure)
from .decoder import (FixedStateTensor, OnnxDecoder, cuda_unavailable_reason, load_decoder,
                      set_cpu_device_factory)
from .device_path import UPLOAD_MERGE_GAP, DeviceOnnxEngineExecutor
from .host import OnnxEngineExecutor
from .static import StaticOnnxEngineExecutor
from . import native  # noqa: E402  (the model loader asks it to select and attach)

__all__ = [
    "CAPTURE_SUFFIX", "LOGITS_FLOAT16", "LOGITS_FLOAT32", "STATUS_CAPACITY_EXCEEDED", "STATUS_FATAL", "STATUS_OK",
    "ModelLoadError", "classify_failure", "FixedStateTensor", "OnnxDecoder", "cuda_unavailable_reason",
    "load_decoder", "set_cpu_device_factory", "UPLOAD_MERGE_GAP", "DeviceOnnxEngineExecutor", "OnnxEngineExecutor",
    "StaticOnnxEngineExecutor",
]
