# Part of oga/_core.pyx (included there; compiled as one module).

# ---------------------------------------------------------------------------------------------
# Token conversion: any 1-D array-like of ints -> contiguous int32, out-of-range values rejected.
# ---------------------------------------------------------------------------------------------

cdef struct TokenSpan:
    const int32_t* data
    size_t count
    int32_t* heap  # PyMem allocation owned by the span (NULL when unused)


cdef int _raise_token_range(object value) except -1:
    raise ValueError(f"Token ids must be in the int32 range [{INT32_MIN}, {INT32_MAX}]; got {value}.")


cdef object _tokens_to_span(object tokens, TokenSpan* span, int32_t* small):
    """Fills `span`; returns an object that must stay alive while span.data is used."""
    cdef Py_ssize_t n, i
    cdef long long v = 0
    cdef int32_t* out
    span.data = NULL
    span.count = 0
    span.heap = NULL
    if type(tokens) is list or type(tokens) is tuple:
        n = len(tokens)
        out = small if n <= _SMALL_TOKENS else <int32_t*>PyMem_Malloc(n * sizeof(int32_t))
        if out == NULL:
            raise MemoryError()
        if out != small:
            span.heap = out
        for i in range(n):
            item = tokens[i]
            if not PyLong_CheckExact(item):
                break
            try:
                v = PyLong_AsLongLong(item)
            except OverflowError:
                v = <long long>INT32_MAX + 1
            if v < INT32_MIN or v > INT32_MAX:
                PyMem_Free(span.heap)
                span.heap = NULL
                _raise_token_range(item)
            out[i] = <int32_t>v
        else:
            span.data = out
            span.count = n
            return None
        # A non-int element: take the general (numpy) path.
        PyMem_Free(span.heap)
        span.heap = NULL
    arr = _tokens_to_int32_array(tokens)
    cdef const int32_t[::1] view = arr
    span.count = view.shape[0]
    span.data = &view[0] if span.count > 0 else NULL
    return view


cdef object _tokens_to_int32_array(object tokens):
    if tokens is None:
        raise TypeError("tokens must be a one-dimensional array-like of int32 token ids, not None.")
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError("tokens must be a one-dimensional array.")
    kind = arr.dtype.kind
    if arr.dtype == np.int32:
        return np.ascontiguousarray(arr)
    if kind == "O" and arr.size and all(type(v) is int for v in arr):
        try:
            arr = np.asarray(arr, dtype=np.int64)
        except OverflowError:
            raise ValueError(f"Token ids must be in the int32 range [{INT32_MIN}, {INT32_MAX}].") from None
        kind = "i"
    if kind not in "iu" and arr.size:
        # Floats, bools and strings are not token ids: converting them would silently truncate.
        raise TypeError(f"tokens must hold integer token ids, not {arr.dtype} values.")
    if arr.size:
        lo = arr.min()
        hi = arr.max()
        if lo < INT32_MIN:
            _raise_token_range(lo)
        if hi > INT32_MAX:
            _raise_token_range(hi)
    return np.ascontiguousarray(arr, dtype=np.int32)


cdef inline void _release_span(TokenSpan* span) noexcept:
    if span.heap != NULL:
        PyMem_Free(span.heap)
        span.heap = NULL
