# Part of oga/_core.pyx (included there; compiled as one module).

# ---------------------------------------------------------------------------------------------
# Argument conversion
# ---------------------------------------------------------------------------------------------
# Cython's own conversion of a C integer parameter truncates a float (3.9 -> 3), and a `bint`
# parameter takes any object's truth value ("no" -> True). onnxruntime-genai's bindings refuse both
# with a TypeError; every integer and boolean argument of the handles goes through these instead.
# Out-of-range values still raise Cython's OverflowError at the conversion to the C type.

from cpython.number cimport PyIndex_Check, PyNumber_Index


cdef inline object _integer(object value, str name):
    """`value` as a Python int: int, bool and numpy integers (anything with __index__); TypeError
    naming the argument for floats, strings, None and other objects."""
    if PyIndex_Check(value):
        return PyNumber_Index(value)
    raise TypeError(f"{name} must be an integer, not {type(value).__name__}")


cdef inline size_t _size_t(object value, str name) except? 0:
    return _integer(value, name)


cdef inline uint64_t _uint64(object value, str name) except? 0:
    return _integer(value, name)


cdef inline int32_t _int32(object value, str name) except? -1:
    return _integer(value, name)


cdef inline bint _boolean(object value, str name) except -1:
    """bool, numpy.bool_ or an integer (as pybind11 converts them); TypeError naming the argument
    for strings, None and other objects."""
    if value is True:
        return True
    if value is False:
        return False
    if isinstance(value, np.bool_):
        return bool(value)
    if PyIndex_Check(value):
        return PyNumber_Index(value) != 0
    raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
