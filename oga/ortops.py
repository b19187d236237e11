"""oga's ONNX Runtime operators: where the library is, and session options that load it.

The library (built from ortops/ as oga/_ortops*.so) adds the operator domain "oga" to a session:
`oga.PagedGroupQueryAttention` (RoPE, paged KV cache write and attention over the block table in
one CPU kernel; see ortops/paged_attention.h), `oga.QuantizedLinear` (a block-quantized linear over
MatMulNBits' inputs; ortops/quantized_linear.h) and the fused graph's norm, activation and LM head. oga's executor registers it on every session it
opens; other ONNX Runtime code can do the same:

    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(oga.ortops.library_path())
"""
from __future__ import annotations

from oga.extensions import extension_path

DOMAIN = "oga"


class OrtOpsUnavailable(RuntimeError):
    """The operator library is not where the installed package should have it."""


def library_path() -> str:
    """The path of the operator library (raises OrtOpsUnavailable when the build did not make it).
    Searched along the package path, which also holds the installed copy when a source checkout
    shadows it (see oga/__init__.py)."""
    path = extension_path("_ortops")
    if path is not None:
        return path
    raise OrtOpsUnavailable("oga's ONNX Runtime operator library (oga/_ortops) is missing: reinstall oga "
                            "(pip install .) so that its build compiles ortops/")


def register(options) -> None:
    """Adds the "oga" operator domain to onnxruntime.SessionOptions `options`."""
    options.register_custom_ops_library(library_path())


def library():
    """The operator library loaded with ctypes (the same instance ONNX Runtime's sessions use), with
    its introspection functions typed."""
    import ctypes

    global _library
    if _library is None:
        lib = ctypes.CDLL(library_path())
        lib.OgaOrtOpsDomain.restype = ctypes.c_char_p
        lib.OgaOrtOpsApiVersion.restype = ctypes.c_uint32
        lib.OgaOrtOpsMath.restype = ctypes.c_char_p
        lib.OgaOrtOpsSetPortable.argtypes = [ctypes.c_int]
        lib.OgaOrtOpsSetPortable.restype = None
        lib.OgaOrtOpsCacheCopies.restype = ctypes.c_uint64
        lib.OgaOrtOpsQuantizedLinearMath.restype = ctypes.c_char_p
        lib.OgaOrtOpsSetQuantizedLinearMath.argtypes = [ctypes.c_char_p]
        lib.OgaOrtOpsSetQuantizedLinearMath.restype = ctypes.c_int
        _library = lib
    return _library


_library = None


def math_kind() -> str:
    """The inner loops the operators use now: "avx2" (AVX2/FMA/F16C) or "portable"."""
    return library().OgaOrtOpsMath().decode()


def quantized_linear_math() -> str:
    """The loops oga.QuantizedLinear uses now: "avx512-vnni", "avx-vnni", "avx2" or "portable" (the
    results are the same bits on each)."""
    return library().OgaOrtOpsQuantizedLinearMath().decode()


def cache_copies() -> int:
    """Attention calls in this process that copied a whole KV cache (present not bound to past)."""
    return int(library().OgaOrtOpsCacheCopies())

