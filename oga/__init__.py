"""oga: a continuous-batching LLM inference engine with a paged KV cache.

The public surface is the experimental Engine API of ONNX Runtime GenAI 0.18: code written for
``onnxruntime_genai``'s Engine runs with ``import oga as og``. The C API of the same engine is
exported by the extension module (see ``library_path()``) for ctypes users.
"""
import os as _os
import pkgutil as _pkgutil

# When `python -m pytest` (or any script) runs from a source checkout, this directory shadows the
# installed package, which holds the compiled extension. extend_path adds the other `oga`
# directories on sys.path, so `oga._core` is found in the installed copy.
__path__ = _pkgutil.extend_path(__path__, __name__)

from . import _core  # noqa: E402


def _find_llguidance():
    """The llguidance wheel's extension module, whose C API runs guidance; found without importing
    llguidance (oga loads it only at the first guided turn). None when it is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llguidance")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for directory in spec.submodule_search_locations:
        for name in sorted(_os.listdir(directory)):
            if name.startswith("_lib.") and name.endswith((".so", ".dylib", ".pyd")):
                return _os.path.join(directory, name)
    return None


_core._set_guidance_library(_find_llguidance())
from ._core import (  # noqa: E402
    EngineErrorCode,
    ErrorKind,
    OgaError,
    EngineEventFlags,
    FinishReason,
    OgaEngine,
    OgaConfig,
    OgaEngineCapabilities,
    OgaEngineEvent,
    OgaEngineEventBuffer,
    OgaGenerator,
    OgaGeneratorParams,
    OgaModel,
    OgaRequest,
    OgaRequestOptions,
    OgaTurnOptions,
    OgaTurnUsage,
)

__version__ = "0.1.0"

# onnxruntime-genai 0.18 names.
Model = OgaModel
Config = OgaConfig
GeneratorParams = OgaGeneratorParams
Generator = OgaGenerator
Engine = OgaEngine
Request = OgaRequest
RequestOptions = OgaRequestOptions
TurnOptions = OgaTurnOptions
EngineEventBuffer = OgaEngineEventBuffer
EngineEvent = OgaEngineEvent
TurnUsage = OgaTurnUsage
EngineCapabilities = OgaEngineCapabilities


def library_path() -> str:
    """Path of the shared library that exports the oga C API (the compiled ``oga._core``).

    ``ctypes.CDLL(oga.library_path())`` gives access to every function of include/oga/oga.h and
    include/oga/oga_ext.h.
    """
    return _os.path.abspath(_core.__file__)


__all__ = [
    "Config",
    "Engine",
    "EngineCapabilities",
    "EngineErrorCode",
    "EngineEvent",
    "EngineEventBuffer",
    "EngineEventFlags",
    "ErrorKind",
    "FinishReason",
    "Generator",
    "GeneratorParams",
    "Model",
    "OgaEngine",
    "OgaEngineCapabilities",
    "OgaEngineEvent",
    "OgaEngineEventBuffer",
    "OgaError",
    "OgaGenerator",
    "OgaGeneratorParams",
    "OgaModel",
    "OgaRequest",
    "OgaRequestOptions",
    "OgaTurnOptions",
    "OgaTurnUsage",
    "Request",
    "RequestOptions",
    "TurnOptions",
    "TurnUsage",
    "library_path",
    "__version__",
]

# onnxruntime-genai 0.18's tokenizer and module-level functions (pure Python; `tokenizers` and
# `jinja2` are imported when a Tokenizer is first created).
from .runtime import (  # noqa: E402
    disable_telemetry_events,
    enable_telemetry_events,
    get_current_gpu_device_id,
    is_cuda_available,
    is_dml_available,
    is_openvino_available,
    is_qnn_available,
    is_rocm_available,
    is_webgpu_available,
    register_execution_provider_library,
    set_current_gpu_device_id,
    set_log_callback,
    set_log_options,
    unregister_execution_provider_library,
)
from .tensor import ElementType, Tensor  # noqa: E402
from .tokenizer import Tokenizer, TokenizerStream  # noqa: E402

# OgaCreateModel loads ONNX model directories through the ONNX Runtime executor (oga/executor/), and
# stop strings and guidance read token texts through oga.tokenizer: _core calls them back, and
# imports neither.
from . import executor as _executor  # noqa: E402
from . import tokenizer as _tokenizer  # noqa: E402

_core._register_callbacks(_executor, _tokenizer)

from . import runtime as _runtime  # noqa: E402

__all__ += ["ElementType", "Tensor", "Tokenizer", "TokenizerStream"] + _runtime.__all__

# The rest of onnxruntime-genai 0.18's names: importable, and raising a clear error when used
# (oga/unsupported.py; README "Not supported by oga").
from .unsupported import (  # noqa: E402
    Adapters,
    Audios,
    Images,
    MtpGenerator,
    MultiModalProcessor,
    NamedTensors,
    StreamingProcessor,
)
from . import unsupported as _unsupported  # noqa: E402

__all__ += _unsupported.__all__

# 0.18 also exposes its compiled module, `onnxruntime_genai.onnxruntime_genai`, which holds every
# public name; here the package itself holds them. Left out of __all__ so that `from oga import *`
# cannot shadow a user's `onnxruntime_genai` import.
import sys as _sys  # noqa: E402

onnxruntime_genai = _sys.modules[__name__]
_sys.modules.setdefault(__name__ + ".onnxruntime_genai", onnxruntime_genai)
