# Part of oga/_core.pyx (included there; compiled as one module).

# ---------------------------------------------------------------------------------------------
# OgaExtDeviceOps over a Python object (oga/device_ops.py DeviceOps): the table's context is the
# object, each callback calls its method of the same name with the core's host arrays as numpy
# views (no copies, valid only during the call). An exception becomes a nonzero return with
# "TypeName: text" in `message`; allocate returns NULL on any exception (the core's only failure
# for it: out of memory).
# ---------------------------------------------------------------------------------------------

cdef object _host_array(const void* data, size_t count, object dtype, size_t itemsize, bint writable=False):
    """A numpy view of `count` elements at `data` (read-only unless `writable`)."""
    if count == 0:
        return np.empty(0, dtype=dtype)
    if data == NULL:
        raise ValueError(f"NULL array of {count} elements")
    return np.frombuffer(PyMemoryView_FromMemory(<char*>data, <Py_ssize_t>(count * itemsize),
                                                 PyBUF_WRITE if writable else PyBUF_READ), dtype=dtype)


cdef object _ADDRESS = np.dtype(np.uintp)
cdef object _INT32 = np.dtype(np.int32)
cdef object _INT64 = np.dtype(np.int64)
cdef object _UINT64 = np.dtype(np.uint64)
cdef object _FLOAT32 = np.dtype(np.float32)


cdef void* _device_allocate(void* context, size_t nbytes) noexcept nogil:
    with gil:
        try:
            return <void*><size_t>(<object>context).allocate(nbytes)
        except BaseException as error:
            if _is_interruption(error):
                _defer_interruption(error)  # engine creation fails; its wrapper raises it
                return NULL
            # The contract's only failure is NULL, which the core reports as a budget too small; a
            # device failure that is not out-of-memory is named here so it is not mistaken for one.
            import warnings
            warnings.warn(f"oga: a device allocation of {nbytes} bytes failed: {type(error).__name__}: {error}",
                          RuntimeWarning)
            return NULL


cdef void _device_release(void* context, void* memory) noexcept nogil:
    # The contract has no failure here; an exception is reported as unraisable (printed).
    with gil:
        (<object>context).release(<size_t>memory)


cdef int32_t _device_copy(void* context, size_t count, const void* const* sources, void* const* destinations,
                          size_t nbytes, char* message, size_t capacity) noexcept nogil:
    with gil:
        try:
            (<object>context).copy(_host_array(sources, count, _ADDRESS, sizeof(void*)),
                                   _host_array(destinations, count, _ADDRESS, sizeof(void*)), nbytes)
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_fill_zero(void* context, void* memory, size_t nbytes, char* message,
                               size_t capacity) noexcept nogil:
    with gil:
        try:
            (<object>context).fill_zero(<size_t>memory, nbytes)
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_synchronize(void* context, char* message, size_t capacity) noexcept nogil:
    with gil:
        try:
            (<object>context).synchronize()
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_memory_info(void* context, size_t* free_bytes, size_t* total_bytes, char* message,
                                 size_t capacity) noexcept nogil:
    with gil:
        try:
            free, total = (<object>context).memory_info()
            free_bytes[0] = free
            total_bytes[0] = total
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_read(void* context, size_t count, const void* const* sources, void* const* destinations,
                          size_t nbytes, char* message, size_t capacity) noexcept nogil:
    with gil:
        try:
            (<object>context).read(_host_array(sources, count, _ADDRESS, sizeof(void*)),
                                   _host_array(destinations, count, _ADDRESS, sizeof(void*)), nbytes)
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef int32_t _device_sample(void* context, const OgaExtDeviceSampling* sampling, char* message,
                            size_t capacity) noexcept nogil:
    cdef size_t n = sampling.num_rows
    cdef int64_t history = 0
    with gil:
        try:
            if n > 0 and sampling.history_offsets != NULL:
                history = sampling.history_offsets[n]
                if history < 0:
                    raise ValueError(f"history_offsets[{n}] is {history}")
            (<object>context).sample(
                n, <size_t>sampling.logits, sampling.logits_type, sampling.logits_row_stride, sampling.vocab_size,
                _host_array(sampling.logits_rows, n, _INT32, 4),
                _host_array(sampling.temperatures, n, _FLOAT32, 4),
                _host_array(sampling.top_ks, n, _INT32, 4),
                _host_array(sampling.top_ps, n, _FLOAT32, 4),
                _host_array(sampling.seeds, n, _UINT64, 8),
                _host_array(sampling.counters, n, _UINT64, 8),
                _host_array(sampling.mask_eos, n, _INT32, 4),
                _host_array(sampling.eos_ids, sampling.num_eos, _INT32, 4),
                _host_array(sampling.repetition_penalties, n, _FLOAT32, 4),
                _host_array(sampling.history_offsets, n + 1 if n > 0 else 0, _INT64, 8),
                _host_array(sampling.history_tokens, <size_t>history, _INT32, 4),
                _host_array(sampling.tokens, n, _INT32, 4, True))
            return 0
        except BaseException as error:
            return _callback_failure(error, message, capacity, 1)


cdef class _DeviceOpsTable:
    """An OgaExtDeviceOps table (embedded, so its address is stable) over a Python operations
    object, which this table keeps alive. Whoever gives `address` to the core keeps the table for
    as long as the core may call it. Made by _device_ops_table()."""

    cdef OgaExtDeviceOps table
    cdef readonly object ops

    def __init__(self):
        raise TypeError(_NO_CONSTRUCTOR)

    @property
    def address(self):
        """The OgaExtDeviceOps* as an int."""
        return <size_t>&self.table


def _device_ops_table(ops):
    """The OgaExtDeviceOps table over `ops` (oga.device_ops.DeviceOps, or any object with its
    methods): `.address` is the table's address. `sample` is NULL when ops.samples_on_device is
    false (the engine then reads logits rows back and selects on the host)."""
    cdef _DeviceOpsTable table = _DeviceOpsTable.__new__(_DeviceOpsTable)
    table.ops = ops
    table.table.context = <void*>ops
    table.table.allocate = _device_allocate
    table.table.release = _device_release
    table.table.copy = _device_copy
    table.table.fill_zero = _device_fill_zero
    table.table.synchronize = _device_synchronize
    table.table.read = _device_read
    table.table.memory_info = _device_memory_info
    table.table.sample = NULL
    if getattr(ops, "samples_on_device", True):
        table.table.sample = _device_sample
    return table
