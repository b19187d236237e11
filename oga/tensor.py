"""``og.Tensor``: the small array wrapper 0.18 returns from ``Tokenizer.encode_batch``."""
import enum as _enum

import numpy as _np

__all__ = ["ElementType", "Tensor"]


class ElementType(_enum.IntEnum):
    """ONNX tensor element types (the values of OgaElementType)."""
    undefined = 0
    float32 = 1
    uint8 = 2
    int8 = 3
    uint16 = 4
    int16 = 5
    int32 = 6
    int64 = 7
    string = 8
    bool = 9
    float16 = 10
    float64 = 11
    uint32 = 12
    uint64 = 13


_NUMPY_TO_ELEMENT = {
    _np.dtype(_np.float32): ElementType.float32, _np.dtype(_np.uint8): ElementType.uint8,
    _np.dtype(_np.int8): ElementType.int8, _np.dtype(_np.uint16): ElementType.uint16,
    _np.dtype(_np.int16): ElementType.int16, _np.dtype(_np.int32): ElementType.int32,
    _np.dtype(_np.int64): ElementType.int64, _np.dtype(_np.bool_): ElementType.bool,
    _np.dtype(_np.float16): ElementType.float16, _np.dtype(_np.float64): ElementType.float64,
    _np.dtype(_np.uint32): ElementType.uint32, _np.dtype(_np.uint64): ElementType.uint64,
}


class Tensor:
    """``og.Tensor(array)``: an n-dimensional array with ``shape()``, ``type()``, ``as_numpy()``.

    Holds a C-contiguous copy of the array. ``data()`` (a raw-pointer capsule in 0.18) is not
    provided."""

    def __init__(self, array):
        if not isinstance(array, _np.ndarray):
            raise TypeError(f"Tensor(): expected numpy.ndarray, got {type(array).__name__}")
        if array.dtype not in _NUMPY_TO_ELEMENT:
            raise TypeError(f"Tensor(): unsupported element type {array.dtype}")
        self._array = _np.ascontiguousarray(array).copy()

    def shape(self):
        """shape() -> list[int]"""
        return list(self._array.shape)

    def type(self):
        """type() -> ElementType"""
        return _NUMPY_TO_ELEMENT[self._array.dtype]

    def as_numpy(self):
        """as_numpy() -> numpy.ndarray (a view of the tensor's data)"""
        return self._array

    def __repr__(self):
        return f"<oga.Tensor shape={self.shape()} type={self.type().name}>"
