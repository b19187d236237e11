"""The kernels of cuda/ run on the CPU: compiled with g++ against tests/kernel_emulator.h into a
shared library, launched through oga.cuda_kernels' typed launchers (the same argument packing the
device gets), on host memory."""
import ctypes
import os
import re
import subprocess

import numpy as np

from oga.cuda_kernels import KERNEL_FILES, KernelLaunches

TESTS = os.path.dirname(os.path.abspath(__file__))
CUDA_DIR = os.path.join(os.path.dirname(TESTS), "cuda")


def build_emulated_kernels(directory):
    """Compiles every kernel file into `directory`/emulated_kernels.so; returns its path."""
    lines = ['#include "kernel_emulator.h"']
    for name in KERNEL_FILES:
        lines.append(f'#include "{name}.cu"')
        with open(os.path.join(CUDA_DIR, f"{name}.cu")) as f:
            entries = re.findall(r'extern "C" __global__ void(?: __launch_bounds__\(\d+\))?\s+(\w+)\s*\(', f.read())
        assert sorted(entries) == sorted(KERNEL_FILES[name]), (name, entries)
        lines += [f"OGA_EMULATE({entry})" for entry in entries]
    source = os.path.join(directory, "emulated_kernels.cpp")
    with open(source, "w") as f:
        f.write("\n".join(lines) + "\n")
    library = os.path.join(directory, "emulated_kernels.so")
    # -O0: the emulated threads are coroutines the optimizer knows nothing of, and a static
    # (__shared__) variable whose address never escapes could otherwise be kept in a register
    # across a barrier.
    command = ["g++", "-std=c++17", "-O0", "-g0", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
               f"-I{TESTS}", f"-I{CUDA_DIR}", source, "-o", library]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"compiling the emulated kernels failed:\n{' '.join(command)}\n{result.stderr}")
    return library


class EmulatedKernels(KernelLaunches):
    def __init__(self, library):
        self._library = ctypes.CDLL(library)
        launch = self._library.oga_emulator_launch
        launch.restype = ctypes.c_int
        launch.argtypes = [ctypes.c_char_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        self.launches = []

    def _launch(self, name, grid, block, shared_bytes, stream, params):
        self.launches.append((name, grid, block, shared_bytes))
        error = ctypes.create_string_buffer(512)
        if self._library.oga_emulator_launch(name.encode(), *grid, *block, shared_bytes, ctypes.addressof(params),
                                             error, len(error)) != 0:
            raise RuntimeError(f"{name}: {error.value.decode()}")


class HostBuffer:
    def __init__(self, array):
        self.array = array
        self.ptr = array.ctypes.data


class HostMemory:
    """'Device' memory for the emulator: host arrays, kept alive as long as this object."""

    def __init__(self):
        self._buffers = []

    def put(self, array):
        buffer = HostBuffer(np.ascontiguousarray(array).copy())
        self._buffers.append(buffer)
        return buffer

    def empty(self, count, dtype):
        return self.put(np.zeros(count, dtype=dtype))

    def get(self, buffer):
        return buffer.array.copy()

    def sync(self):
        pass
