"""Where the GPU path's memory lives: one interface over the device a session runs on.

The ONNX Runtime executor's device path (device KV caches, staged packed inputs, logits left on the
device) and the engine's device operations (OgaExtDeviceOps: fixed-state copies, logits read-back,
batched sampling) are written against this interface, so the same code drives

- ``CudaDevice``: device memory, pinned host staging and copies on one CUDA stream through
  cuda-python (the memory ONNX Runtime's CUDA execution provider binds by address), and
- ``HostDevice``: host memory standing in for the device, with ONNX Runtime's "cpu" device type;
  the CPU test suite runs the whole device path on it (with the kernels on the CPU emulator).

Addresses are ints (0 is NULL). Copies and fills are ordered on the device's stream and may be
asynchronous until ``synchronize``.
"""
import ctypes

import numpy as np


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

    def live_allocations(self):
        return len(self._allocations)
