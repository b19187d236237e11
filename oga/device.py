"""Where the GPU path's memory lives: one interface over the device a session runs on.

The ONNX Runtime executor's device path (device KV caches, staged packed inputs, logits left on the
device) and the engine's device operations (OgaExtDeviceOps: fixed-state copies, logits read-back,
batched sampling) are written against this interface, so the same code drives

- ``CudaDevice``: device memory, pinned host staging and copies on one CUDA stream through
  cuda-python (the memory ONNX Runtime's CUDA execution provider binds by address), and
- ``HostDevice``: host memory standing in for the device, with ONNX Runtime's "cpu" device type;
  the CPU test suite runs the whole device path on it (with the kernels on the CPU emulator).

Addresses are ints (0 is NULL). Copies and fills are ordered on the device's stream and may be
asynchronous until ``synchronize``. An event marks a point of the stream: ``record_event`` enqueues
it, ``wait_event`` returns once the stream has passed it (how a reused pinned staging buffer knows
that the upload reading it is done).

Importing this module never touches the driver; ``CudaDevice`` imports cuda-python when it is
constructed and raises ``CudaUnavailable`` (oga.cuda_kernels) with the reason when it cannot run.
"""
import ctypes
import os

import numpy as np

from oga.cuda_kernels import CudaUnavailable


class DeviceOutOfMemory(MemoryError):
    """An allocation the device cannot satisfy (the engine reports ExecutionCapacityExceeded)."""


class DeviceError(RuntimeError):
    """Any other device failure; the text carries the device's own error name."""


# Alignment of every allocation: what ONNX Runtime and the kernels' vector loads expect.
ALIGNMENT = 256


class HostDevice:
    """Host memory as the device. Every allocation is zero-filled, 256-byte aligned and owned by
    this object until released."""

    ort_device_type = "cpu"
    device_id = 0
    stream = 0
    name = "host"

    def __init__(self, kernels=None):
        self.kernels = kernels  # a cuda_kernels.KernelLaunches that can run on host memory, or None
        self._allocations = {}

    def allocate(self, nbytes):
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        try:
            raw = np.zeros(max(nbytes, 1) + ALIGNMENT, dtype=np.uint8)
        except MemoryError as error:
            raise DeviceOutOfMemory(f"host device: cannot allocate {nbytes} bytes") from error
        offset = (-raw.ctypes.data) % ALIGNMENT
        address = raw.ctypes.data + offset
        self._allocations[address] = raw
        return address

    def release(self, address):
        if self._allocations.pop(int(address), None) is None:
            raise DeviceError(f"host device: release of {int(address):#x}, which is not allocated here")

    def host_buffer(self, nbytes):
        """Staging memory on the host (pinned on a CUDA device): a uint8 array."""
        return np.zeros(int(nbytes), dtype=np.uint8)

    def upload(self, destination, source, nbytes):
        if nbytes:
            ctypes.memmove(int(destination), int(source), int(nbytes))

    def download(self, destination, source, nbytes):
        if nbytes:
            ctypes.memmove(int(destination), int(source), int(nbytes))

    def copy(self, destination, source, nbytes):
        if nbytes:
            ctypes.memmove(int(destination), int(source), int(nbytes))

    def fill_zero(self, address, nbytes):
        if nbytes:
            ctypes.memset(int(address), 0, int(nbytes))

    def synchronize(self):
        pass

    # Host copies complete when they return, so an event has nothing to wait for.
    def create_event(self):
        return None

    def record_event(self, event):
        pass

    def wait_event(self, event):
        pass

    def destroy_event(self, event):
        pass

    def memory_info(self):
        """(free, total) bytes: the host's available and physical memory."""
        return _host_memory_info()

    def live_allocations(self):
        return len(self._allocations)

    def close(self):
        self._allocations.clear()


def _host_memory_info():
    """(available, total) host memory in bytes: MemAvailable / MemTotal where /proc/meminfo exists,
    else the free and physical pages."""
    try:
        values = {}
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                values[name] = int(rest.split()[0]) * 1024
        return values["MemAvailable"], values["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _import_runtime():
    try:
        from cuda.bindings import runtime
    except ImportError as error:
        raise CudaUnavailable(
            f"cuda-python is not installed ({error}); install oga's gpu extra: pip install 'oga[gpu]'"
        ) from None
    return runtime


class _PinnedMemory:
    """Owner of one cudaHostAlloc'd block, exposed to numpy as a uint8 array (numpy keeps this
    object as the array's base, so the block is freed when the last view of it goes)."""

    def __init__(self, runtime, address, nbytes):
        self._runtime = runtime
        self._address = address
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 3}

    def __del__(self):
        try:
            self._runtime.cudaFreeHost(self._address)
        except Exception:  # noqa: BLE001 -- at interpreter exit the runtime may already be gone
            pass


class CudaDevice:
    """One CUDA device through cuda-python's runtime API, in the device's primary context (the one
    ONNX Runtime's CUDA execution provider and the kernels of oga.cuda_kernels use, so addresses
    are valid for all three). Everything is enqueued on one non-blocking stream created here;
    every CUDA error becomes DeviceError (DeviceOutOfMemory for an allocation the device cannot
    satisfy) carrying the CUDA error's name and text."""

    ort_device_type = "cuda"

    def __init__(self, device_id=0, with_kernels=True):
        """Raises CudaUnavailable when cuda-python, the driver or the device is missing, or (with
        `with_kernels`) when the kernels cannot be loaded."""
        from oga import cuda_kernels

        self.device_id = int(device_id)
        self._stream = None
        self._allocations = {}
        # The driver probe names what is missing (cuda-python, libcuda, a CUDA 13 driver, the device);
        # the runtime alone would report a missing driver as an "insufficient" one.
        cuda_kernels._probe_device(self.device_id)
        runtime = _import_runtime()
        self._runtime = runtime
        self.kernels = cuda_kernels.load_kernels(self.device_id) if with_kernels else None
        self._make_current()
        properties = self._check(runtime.cudaGetDeviceProperties(self.device_id), "cudaGetDeviceProperties")
        name = properties.name
        name = name.split(b"\0", 1)[0].decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        self.name = f"cuda:{self.device_id} ({name})"
        self._stream = self._check(runtime.cudaStreamCreateWithFlags(runtime.cudaStreamNonBlocking),
                                   "cudaStreamCreateWithFlags")
        self.stream = int(self._stream)

    def _error_text(self, error):
        _, name = self._runtime.cudaGetErrorName(error)
        _, text = self._runtime.cudaGetErrorString(error)
        name = name.decode() if isinstance(name, bytes) else str(error)
        text = text.decode() if isinstance(text, bytes) else ""
        return f"{name}: {text}"

    def _check(self, result, what):
        """The values of a cuda-python runtime call's result tuple, or the error raised."""
        runtime = self._runtime
        error, *values = result
        if error != runtime.cudaError_t.cudaSuccess:
            # A failed runtime call also sets the thread's "last error"; ONNX Runtime checks it after
            # its own kernels (cudaGetLastError) and would report this failure as its own.
            runtime.cudaGetLastError()
            if error == runtime.cudaError_t.cudaErrorMemoryAllocation:
                raise DeviceOutOfMemory(f"CUDA device {self.device_id}: {what} failed: {self._error_text(error)}")
            raise DeviceError(f"{what} failed: {self._error_text(error)}")
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    def _make_current(self):
        # The runtime's current device is per thread, and the engine's owner thread need not be the
        # thread that made this object.
        self._check(self._runtime.cudaSetDevice(self.device_id), "cudaSetDevice")

    def allocate(self, nbytes):
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        self._make_current()
        address = int(self._check(self._runtime.cudaMalloc(max(nbytes, 1)), f"cudaMalloc({nbytes} bytes)"))
        self._allocations[address] = nbytes
        return address

    def release(self, address):
        address = int(address)
        if self._allocations.pop(address, None) is None:
            raise DeviceError(f"CUDA device {self.device_id}: release of {address:#x}, which is not allocated here")
        self._make_current()
        self._check(self._runtime.cudaFree(address), "cudaFree")

    def host_buffer(self, nbytes):
        """Pinned (page-locked) host memory as a uint8 array; freed when the array goes."""
        nbytes = int(nbytes)
        self._make_current()
        address = int(self._check(self._runtime.cudaHostAlloc(max(nbytes, 1), self._runtime.cudaHostAllocDefault),
                                  f"cudaHostAlloc({nbytes} bytes)"))
        return np.asarray(_PinnedMemory(self._runtime, address, nbytes))

    def _memcpy(self, destination, source, nbytes, kind, what):
        if nbytes:
            self._make_current()
            self._check(self._runtime.cudaMemcpyAsync(int(destination), int(source), int(nbytes), kind, self._stream),
                        what)

    def upload(self, destination, source, nbytes):
        self._memcpy(destination, source, nbytes, self._runtime.cudaMemcpyKind.cudaMemcpyHostToDevice,
                     "cudaMemcpyAsync (host to device)")

    def download(self, destination, source, nbytes):
        self._memcpy(destination, source, nbytes, self._runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                     "cudaMemcpyAsync (device to host)")

    def copy(self, destination, source, nbytes):
        self._memcpy(destination, source, nbytes, self._runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
                     "cudaMemcpyAsync (device to device)")

    def fill_zero(self, address, nbytes):
        if nbytes:
            self._make_current()
            self._check(self._runtime.cudaMemsetAsync(int(address), 0, int(nbytes), self._stream), "cudaMemsetAsync")

    def synchronize(self):
        self._make_current()
        self._check(self._runtime.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def create_event(self):
        self._make_current()
        return self._check(self._runtime.cudaEventCreateWithFlags(self._runtime.cudaEventDisableTiming),
                           "cudaEventCreateWithFlags")

    def record_event(self, event):
        self._make_current()
        self._check(self._runtime.cudaEventRecord(event, self._stream), "cudaEventRecord")

    def wait_event(self, event):
        # An event never recorded counts as complete.
        self._check(self._runtime.cudaEventSynchronize(event), "cudaEventSynchronize")

    def destroy_event(self, event):
        self._check(self._runtime.cudaEventDestroy(event), "cudaEventDestroy")

    def memory_info(self):
        """(free, total) bytes of the device's memory (cudaMemGetInfo)."""
        self._make_current()
        free, total = self._check(self._runtime.cudaMemGetInfo(), "cudaMemGetInfo")
        return int(free), int(total)

    def live_allocations(self):
        return len(self._allocations)

    def close(self):
        """Waits for the stream, frees what is still allocated here and destroys the stream. The
        kernels stay loaded (they are per process, oga.cuda_kernels.load_kernels)."""
        if self._stream is None:
            return
        try:
            self.synchronize()
        finally:
            for address in list(self._allocations):
                self._allocations.pop(address)
                self._runtime.cudaFree(address)
            self._runtime.cudaStreamDestroy(self._stream)
            self._stream = None
            self.stream = 0


def open_device(kind, device_id=0, **options):
    """A device by ONNX Runtime's device type name: "cpu" -> HostDevice, "cuda" -> CudaDevice
    (CudaUnavailable when it cannot run here)."""
    if kind == "cpu":
        return HostDevice(**options)
    if kind == "cuda":
        return CudaDevice(device_id, **options)
    raise ValueError(f"unknown device kind {kind!r}; expected 'cpu' or 'cuda'")
