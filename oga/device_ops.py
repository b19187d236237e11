"""OgaExtDeviceOps (include/oga/oga_ext.h) in Python, over a device of oga.device: the memory the
engine core keeps on the executor's device (the fixed-state pool), the read-back of logits rows,
and batched token selection on device logits with the kernels of cuda/.

The Cython layer (oga/_core.pyx, ``_device_ops_table``) turns a ``DeviceOps`` into the C table the
core calls; every method here is one operation of that table, with the core's host arrays passed
as numpy views that are valid only during the call (nothing here keeps them).

Steady state allocates nothing: the pinned staging every launch's arguments travel through, and
the device scratch the sampler processes logits rows in, grow geometrically when a larger batch
(or history) first arrives and are reused afterwards (``reserve`` sizes them up front).
"""
import functools
import threading

import numpy as np

from oga import _core
from oga.cuda_kernels import CudaUnavailable
from oga.device import DeviceError, DeviceOutOfMemory

# OgaExtLogitsType -> element type of a logits row.
LOGITS_DTYPES = {int(_core.LogitsType.FLOAT32): np.dtype(np.float32), int(_core.LogitsType.FLOAT16): np.dtype(np.float16)}

_ALIGNMENT = 16  # of every array packed into a staging buffer (the kernels read 8-byte words)


class _Layout:
    """Arrays packed one after another, each aligned: name -> (byte offset, dtype, count)."""

    def __init__(self, fields):
        self.fields = {}
        offset = 0
        for name, dtype, count in fields:
            dtype = np.dtype(dtype)
            offset = (offset + _ALIGNMENT - 1) // _ALIGNMENT * _ALIGNMENT
            self.fields[name] = (offset, dtype, int(count))
            offset += dtype.itemsize * int(count)
        self.nbytes = offset

    def offset(self, name):
        return self.fields[name][0]

    def view(self, host, name):
        """The array `name` inside the host buffer `host` (uint8)."""
        offset, dtype, count = self.fields[name]
        return host[offset : offset + dtype.itemsize * count].view(dtype)


class _DeviceBuffer:
    """Device memory grown geometrically and never shrunk."""

    def __init__(self, device):
        self.device = device
        self.address = 0
        self.capacity = 0

    def ensure(self, nbytes):
        if nbytes <= self.capacity:
            return
        self._replace(max(int(nbytes), 2 * self.capacity, 256))

    def _replace(self, capacity):
        address = self.device.allocate(capacity)
        self.release()
        self.address, self.capacity = address, capacity

    def release(self):
        if self.address:
            # Work still queued may read the old buffer.
            self.device.synchronize()
            self.device.release(self.address)
        self.address, self.capacity = 0, 0


class _Staging(_DeviceBuffer):
    """A pinned host buffer and the device buffer it is uploaded into, of one size."""

    host = None

    def _replace(self, capacity):
        host = self.device.host_buffer(capacity)
        super()._replace(capacity)
        self.host = host

    def release(self):
        super().release()
        self.host = None


def _copy_layout(count):
    # state_copy.cu's gather: each pair is a "buffer" of one row (row index 0) of `bytes`.
    return _Layout([("sources", np.uint64, count), ("destinations", np.uint64, count), ("sizes", np.uint64, count),
                    ("rows", np.int32, 1)])


def _sample_layout(num_rows, num_eos, history):
    """Everything one sample call uploads, then the tokens the kernels write (not uploaded; last).
    Arrays marked (order) are in the sampling order: the processed rows first, then the others;
    the rest are in the engine's row order, which the processing kernels read."""
    n = num_rows
    return _Layout([
        ("seeds", np.uint64, n),              # (order)
        ("counters", np.uint64, n),           # (order); the kernel writes next counters over it
        ("history_offsets", np.int64, n + 1),  # shifted to the uploaded span of the history
        # The copy of the processed rows into the scratch, as copy() does it: each row one "buffer"
        # of one row (row index 0) of vocab_size logits.
        ("gather_sources", np.uint64, n),
        ("gather_destinations", np.uint64, n),
        ("gather_sizes", np.uint64, n),
        ("gather_row", np.int32, 1),
        ("temperatures", np.float32, n),      # (order)
        ("top_ps", np.float32, n),            # (order)
        ("top_ks", np.int32, n),              # (order)
        ("sample_rows", np.int32, n),         # (order) logits rows of the unprocessed rows
        ("scratch_rows", np.int32, n),        # row -> its scratch row (0 for an unprocessed row)
        ("generated", np.int32, n),           # zeros: mask_eos masks where generated < min_generated
        ("min_generated", np.int32, n),       # 1 where the row's EOS ids are masked
        ("penalties", np.float32, n),
        ("eos_ids", np.int32, num_eos),
        ("history_tokens", np.int32, history),
        ("tokens", np.int32, n),              # written by the sampling kernel
    ])


def _serialized(method):
    """Every engine of a model shares its DeviceOps (the staging, the scratch, the stream), each
    engine from its own owner thread, and cuda-python releases the GIL inside its calls: one
    operation at a time."""

    @functools.wraps(method)
    def serialized(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return serialized


class DeviceOps:
    """The operations of OgaExtDeviceOps over `device` (oga.device.CudaDevice or HostDevice).
    `device.kernels` (a cuda_kernels.KernelLaunches that runs on the device's memory, or None)
    makes batched copies one launch and enables ``sample``. `sample_block` and `penalty_block` are
    the thread-block sizes of those kernels (multiples of 32; the CPU emulator wants them small)."""

    def __init__(self, device, *, sample_block=1024, penalty_block=256):
        self.device = device
        self.kernels = device.kernels
        self.sample_block = sample_block
        self.penalty_block = penalty_block
        self._lock = threading.RLock()
        self._copy_staging = _Staging(device)
        # Recorded after each upload out of the pinned copy staging: copies are asynchronous, so the
        # next copy may rewrite that staging only once the stream has read it.
        self._copy_staging_read = device.create_event()
        self._sample_staging = _Staging(device)
        self._scratch = _DeviceBuffer(device)

    @property
    def samples_on_device(self):
        """Whether ``sample`` can run (OgaExtDeviceOps.sample is NULL otherwise)."""
        return self.kernels is not None

    @_serialized
    def reserve(self, max_rows, vocab_size, *, row_stride=None, logits_itemsize=4, max_eos=8,
                max_history_tokens=0, max_copies=0):
        """Sizes the staging and scratch for steps of up to `max_rows` rows of `row_stride` (default
        `vocab_size`) logits of `logits_itemsize` bytes, `max_eos` EOS ids, `max_history_tokens`
        history tokens (over the rows with a repetition penalty) and batched copies of up to
        `max_copies` pairs, so that such steps allocate nothing. DeviceOutOfMemory when the device
        cannot hold them."""
        row_stride = vocab_size if row_stride is None else row_stride
        if self.kernels is not None and max_rows > 0:
            self._sample_staging.ensure(_sample_layout(max_rows, max_eos, max_history_tokens).nbytes)
            self._scratch.ensure(max_rows * row_stride * logits_itemsize)
        if self.kernels is not None and max_copies > 1:
            self._copy_staging.ensure(_copy_layout(max_copies).nbytes)

    # Memory

    def allocate(self, nbytes):
        """Device memory of `nbytes` (aligned to 256 bytes) as an int address; 0 when the device
        is out of memory. Other device failures raise."""
        try:
            return self.device.allocate(nbytes)
        except DeviceOutOfMemory:
            return 0

    def release(self, address):
        self.device.release(address)

    @_serialized
    def copy(self, sources, destinations, nbytes):
        """destinations[i] <- `nbytes` at sources[i] (uint64 device addresses, never overlapping),
        enqueued on the device's stream: one gather launch for several pairs when the device has
        kernels, else one copy per pair."""
        sources = np.asarray(sources, dtype=np.uint64)
        destinations = np.asarray(destinations, dtype=np.uint64)
        count = len(sources)
        if len(destinations) != count:
            raise ValueError(f"{count} sources but {len(destinations)} destinations")
        if count == 0 or nbytes == 0:
            return
        if self.kernels is None or count == 1:
            for source, destination in zip(sources.tolist(), destinations.tolist()):
                self.device.copy(destination, source, nbytes)
            return
        layout = _copy_layout(count)
        staging = self._copy_staging
        self.device.wait_event(self._copy_staging_read)
        staging.ensure(layout.nbytes)
        host = staging.host
        layout.view(host, "sources")[:] = sources
        layout.view(host, "destinations")[:] = destinations
        layout.view(host, "sizes")[:] = nbytes
        layout.view(host, "rows")[0] = 0
        self.device.upload(staging.address, host.ctypes.data, layout.nbytes)
        self.device.record_event(self._copy_staging_read)
        base = staging.address
        with _launch_errors():
            self.kernels.gather_rows(base + layout.offset("sources"), base + layout.offset("destinations"),
                                     base + layout.offset("sizes"), count, base + layout.offset("rows"), 1,
                                     max_row_bytes=nbytes, stream=self.device.stream)

    def fill_zero(self, address, nbytes):
        self.device.fill_zero(address, nbytes)

    def synchronize(self):
        self.device.synchronize()

    def memory_info(self):
        """(free, total) bytes of the device's memory, for sizing the paged KV cache."""
        return self.device.memory_info()

    @_serialized
    def read(self, sources, destinations, nbytes):
        """HOST destinations[i] <- `nbytes` at device sources[i]; complete on return."""
        sources = np.asarray(sources, dtype=np.uint64)
        destinations = np.asarray(destinations, dtype=np.uint64)
        if len(destinations) != len(sources):
            raise ValueError(f"{len(sources)} sources but {len(destinations)} destinations")
        if nbytes:
            for source, destination in zip(sources.tolist(), destinations.tolist()):
                self.device.download(destination, source, nbytes)
        self.device.synchronize()

    # Sampling

    @_serialized
    def sample(self, num_rows, logits, logits_type, row_stride, vocab_size, logits_rows, temperatures, top_ks, top_ps,
               seeds, counters, mask_eos, eos_ids, penalties, history_offsets, history_tokens, tokens_out):
        """OgaExtDeviceSampling: writes the selected token (or -1) of every row into `tokens_out`
        (int32 host array); complete on return. `logits` is the executor's device address, which
        is never written: rows that need processing (mask_eos set, or a repetition penalty other
        than 1) are copied into the scratch and processed there (the EOS mask, then the penalty, as
        the host sampler does), the others are sampled where they are. Arrays are numpy arrays of
        num_rows entries (history_offsets num_rows + 1, eos_ids any, history_tokens
        history_offsets[num_rows])."""
        n = int(num_rows)
        if n == 0:
            return
        if self.kernels is None:
            raise DeviceError(f"{self.device.name}: no kernels loaded, so no sampling on the device")
        if logits_type not in LOGITS_DTYPES:
            raise ValueError(f"unknown logits type {logits_type}")
        itemsize = LOGITS_DTYPES[logits_type].itemsize
        logits_rows = np.asarray(logits_rows, dtype=np.int32)
        mask_eos = np.asarray(mask_eos, dtype=np.int32)
        eos_ids = np.asarray(eos_ids, dtype=np.int32)
        penalties = np.asarray(penalties, dtype=np.float32)
        history_offsets = np.asarray(history_offsets, dtype=np.int64)

        masked = (mask_eos[:n] != 0) & (len(eos_ids) > 0)
        penalized = penalties[:n] != 1.0
        processed = np.flatnonzero(masked | penalized)
        unprocessed = np.flatnonzero(~(masked | penalized))
        order = np.concatenate([processed, unprocessed])
        p = len(processed)

        # Only the span of the history that penalized rows read is uploaded; offsets are shifted to
        # it (rows outside it have penalty 1 and never read theirs).
        penalized_rows = np.flatnonzero(penalized)
        first = last = 0
        if len(penalized_rows):
            first, last = int(history_offsets[penalized_rows[0]]), int(history_offsets[penalized_rows[-1] + 1])
            if not 0 <= first <= last <= len(history_tokens):
                raise ValueError(f"history offsets [{first}, {last}) outside the {len(history_tokens)} history tokens")

        layout = _sample_layout(n, len(eos_ids), last - first)
        staging = self._sample_staging
        staging.ensure(layout.nbytes)
        stride_bytes = int(row_stride) * itemsize
        row_bytes = int(vocab_size) * itemsize
        if p:
            self._scratch.ensure(p * stride_bytes)  # the scratch rows keep the executor's stride
        host = staging.host

        def put(name, values):
            layout.view(host, name)[:] = values

        put("seeds", np.asarray(seeds)[order])
        put("counters", np.asarray(counters)[order])
        put("temperatures", np.asarray(temperatures)[order])
        put("top_ps", np.asarray(top_ps)[order])
        put("top_ks", np.asarray(top_ks)[order])
        layout.view(host, "sample_rows")[: n - p] = logits_rows[unprocessed]
        layout.view(host, "gather_sources")[:p] = logits_rows[processed].astype(np.uint64) * stride_bytes + int(logits)
        layout.view(host, "gather_destinations")[:p] = (np.arange(p, dtype=np.uint64) * stride_bytes
                                                        + self._scratch.address)
        put("gather_sizes", row_bytes)
        put("gather_row", 0)
        scratch_rows = layout.view(host, "scratch_rows")
        scratch_rows[:] = 0
        scratch_rows[processed] = np.arange(p, dtype=np.int32)
        put("generated", 0)
        put("min_generated", masked)
        put("penalties", penalties[:n])
        put("history_offsets", history_offsets[: n + 1] - first)
        put("eos_ids", eos_ids)
        put("history_tokens", np.asarray(history_tokens)[first:last])

        device = self.device
        base = staging.address
        at = {name: base + offset for name, (offset, _, _) in layout.fields.items()}
        stream = device.stream
        dtype = LOGITS_DTYPES[logits_type]
        device.upload(base, host.ctypes.data, layout.offset("tokens"))
        with _launch_errors():
            if p:
                scratch = self._scratch.address
                self.kernels.gather_rows(at["gather_sources"], at["gather_destinations"], at["gather_sizes"], p,
                                         at["gather_row"], 1, max_row_bytes=row_bytes, stream=stream)
                # Over every row in engine order, reading its scratch row; rows that are not masked
                # (penalized) are skipped by the kernel.
                self.kernels.mask_eos(scratch, row_stride, vocab_size, n, at["generated"], at["min_generated"],
                                      at["eos_ids"], len(eos_ids), dtype=dtype, logits_rows=at["scratch_rows"],
                                      stream=stream)
                if len(penalized_rows):
                    self.kernels.repetition_penalty(scratch, row_stride, vocab_size, n, at["penalties"],
                                                    at["history_offsets"], at["history_tokens"], dtype=dtype,
                                                    logits_rows=at["scratch_rows"], block=self.penalty_block,
                                                    stream=stream)
                self.kernels.sample(scratch, row_stride, vocab_size, p, at["temperatures"], at["top_ks"],
                                    at["top_ps"], at["seeds"], at["counters"], at["tokens"], at["counters"],
                                    dtype=dtype, block=self.sample_block, stream=stream)
            if n - p:
                self.kernels.sample(int(logits), row_stride, vocab_size, n - p, at["temperatures"] + 4 * p,
                                    at["top_ks"] + 4 * p, at["top_ps"] + 4 * p, at["seeds"] + 8 * p,
                                    at["counters"] + 8 * p, at["tokens"] + 4 * p, at["counters"] + 8 * p,
                                    dtype=dtype, logits_rows=at["sample_rows"], block=self.sample_block,
                                    stream=stream)
        tokens = layout.view(host, "tokens")
        device.download(tokens.ctypes.data, at["tokens"], 4 * n)
        device.synchronize()
        tokens_out[order] = tokens

    @_serialized
    def close(self):
        """Releases the staging and scratch (not the memory handed out by ``allocate``)."""
        self._copy_staging.release()
        self._sample_staging.release()
        self._scratch.release()
        if self._copy_staging_read is not None:
            self.device.destroy_event(self._copy_staging_read)
            self._copy_staging_read = None


class _launch_errors:
    """A kernel launch failure (CudaUnavailable from oga.cuda_kernels) is a device failure here."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, CudaUnavailable):
            raise DeviceError(error.reason) from None
        return False
