"""The device kernels of the GPU path (``cuda/*.cu``): finding a device, loading the kernels and
launching them, through cuda-python (``cuda.bindings.driver`` and ``cuda.bindings.nvrtc``).

Importing this module never fails and never touches the driver. ``cuda_status()`` says whether the
kernels can run here and, if not, why; ``load_kernels()`` returns launchers or raises
``CudaUnavailable`` with the reason (no cuda-python, no driver, a driver older than CUDA 13, no
device, no kernel binary and no NVRTC, a kernel that does not compile or load).

Kernel binaries, in the order they are tried for each file:

1. ``<name>.cubin`` (sm_90, built by nvcc at install time when nvcc was present), on a compute
   capability 9.0 device;
2. ``<name>.ptx`` (compute_90, built the same way), JIT-compiled by the driver on a device of
   compute capability 9.0 or newer; a driver that does not know the PTX's ISA version (the PTX of
   a newer nvcc on an older driver) refuses it and the next way is taken;
3. NVRTC at run time, from the shipped source, straight to a cubin for the device's own
   architecture (no PTX passes through the driver, so the driver's PTX ISA limit does not apply).
   The ``gpu`` extra pins ``nvidia-cuda-nvrtc`` to the CUDA 13.0 release the target driver (580)
   supports.

Launchers take device pointers as ints (0 is NULL) and a CUDA stream handle (0: the legacy
default stream); they check host-side arguments and enqueue, nothing more. The typed layer
(``KernelLaunches``) is shared with the CPU emulator of the test suite (tests/kernel_emulation.py),
so the argument packing the device sees is the one the CPU tests run.
"""
import ctypes
import os
import re
import threading

# Every kernel file and the entry points it defines.
KERNEL_FILES = {
    "sampling": ("oga_argmax_f32", "oga_argmax_f16", "oga_sample_f32", "oga_sample_f16"),
    "logits_processing": (
        "oga_mask_eos_f32",
        "oga_mask_eos_f16",
        "oga_repetition_penalty_f32",
        "oga_repetition_penalty_f16",
    ),
    "state_copy": ("oga_gather_rows", "oga_scatter_rows", "oga_copy_blocks"),
}

# The architecture nvcc builds for and NVRTC targets when no device says otherwise.
BUILD_ARCH = 90
# The CUDA major version the driver must support (the build and NVRTC are CUDA 13.0).
MIN_DRIVER_CUDA = 13

_DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a launch gets without opting in


class CudaUnavailable(RuntimeError):
    """The device kernels cannot run here; ``reason`` (also the message) says why."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def kernel_directories():
    """Directories that may hold built kernels: ``oga/kernels`` of every ``oga`` package directory
    (the installed package and, when running from a checkout, the source tree)."""
    from .extensions import package_directories

    dirs = [os.path.join(p, "kernels") for p in package_directories()]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _find_file(filename):
    for directory in kernel_directories():
        path = os.path.join(directory, filename)
        if os.path.isfile(path):
            return path
    return None


def kernel_source_directory():
    """The directory holding the kernel sources (``sampling.cu`` and the headers it includes): a
    checkout's ``cuda/`` first (the sources being worked on), else the copy shipped in
    ``oga/kernels``; None when there is neither."""
    from .extensions import package_directories

    checkouts = [os.path.join(os.path.dirname(os.path.abspath(p)), "cuda") for p in package_directories()]
    for directory in checkouts + kernel_directories():
        if os.path.isfile(os.path.join(directory, "sampling.cu")):
            return directory
    return None


def ptx_isa_version(ptx):
    """The ``.version`` of a PTX text (bytes or str) as (major, minor)."""
    if isinstance(ptx, bytes):
        ptx = ptx.decode("ascii", "replace")
    match = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.MULTILINE)
    if not match:
        raise ValueError("no .version directive in the PTX")
    return int(match.group(1)), int(match.group(2))


def _import_driver():
    try:
        from cuda.bindings import driver
    except ImportError as error:
        raise CudaUnavailable(
            f"cuda-python is not installed ({error}); install oga's gpu extra: pip install 'oga[gpu]'"
        ) from None
    return driver


def _import_nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:
        raise CudaUnavailable(f"cuda-python is not installed ({error}); pip install 'oga[gpu]'") from None
    return nvrtc


def _check(driver, result, what):
    """The values of a cuda-python call's result tuple; CudaUnavailable on an error code."""
    error, *values = result
    if error != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(error)
        name = name.decode() if isinstance(name, bytes) else str(error)
        raise CudaUnavailable(f"{what} failed: {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _nvrtc_check(nvrtc, result, what):
    error, *values = result
    if error != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CudaUnavailable(f"{what} failed: {error.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def nvrtc_version():
    """NVRTC's (major, minor); CudaUnavailable when NVRTC cannot be loaded."""
    nvrtc = _import_nvrtc()
    try:
        return _nvrtc_check(nvrtc, nvrtc.nvrtcVersion(), "nvrtcVersion")
    except RuntimeError as error:  # cuda-python raises RuntimeError when it cannot dlopen libnvrtc
        if isinstance(error, CudaUnavailable):
            raise
        raise CudaUnavailable(
            f"NVRTC cannot be loaded ({error}); install it with: pip install nvidia-cuda-nvrtc==13.0.88"
        ) from None


def compile_kernel(name, arch=f"compute_{BUILD_ARCH}", source_dir=None, extra_options=()):
    """Compiles ``<name>.cu`` with NVRTC. ``arch`` ``compute_XY`` gives PTX, ``sm_XY`` a cubin.
    Returns (binary bytes, log text); CudaUnavailable when NVRTC is missing or the source does not
    compile (the message carries NVRTC's log)."""
    nvrtc_version()  # a clear error when libnvrtc cannot be loaded
    nvrtc = _import_nvrtc()
    source_dir = source_dir or kernel_source_directory()
    if source_dir is None:
        raise CudaUnavailable("the kernel sources (sampling.cu, ...) were not found next to the oga package")
    path = os.path.join(source_dir, f"{name}.cu")
    with open(path, "rb") as f:
        source = f.read()
    program = _nvrtc_check(nvrtc, nvrtc.nvrtcCreateProgram(source, os.path.basename(path).encode(), 0, [], []),
                           "nvrtcCreateProgram")
    try:
        options = [
            f"--gpu-architecture={arch}".encode(),
            b"--std=c++17",
            b"-default-device",
            f"--include-path={source_dir}".encode(),
            *[o.encode() if isinstance(o, str) else o for o in extra_options],
        ]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        # NVRTC writes into the buffers it is given: always a fresh bytearray, never a bytes object
        # (a one-byte bytes object is an interpreter-wide singleton).
        size = _nvrtc_check(nvrtc, nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(program, log)
        log = bytes(log).rstrip(b"\0 ").decode("utf-8", "replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CudaUnavailable(f"NVRTC could not compile {path} for {arch} ({status.name}):\n{log}")
        if arch.startswith("sm_"):
            size = _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
            binary = bytearray(size)
            _nvrtc_check(nvrtc, nvrtc.nvrtcGetCUBIN(program, binary), "nvrtcGetCUBIN")
            return bytes(binary), log
        size = _nvrtc_check(nvrtc, nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize")
        binary = bytearray(size)
        _nvrtc_check(nvrtc, nvrtc.nvrtcGetPTX(program, binary), "nvrtcGetPTX")
        return bytes(binary).rstrip(b"\0"), log
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _probe_device(device):
    """(driver module, CUdevice, description, (major, minor)) of `device`; CudaUnavailable if none."""
    driver = _import_driver()
    try:
        result = driver.cuInit(0)
    except RuntimeError as error:  # cuda-python cannot load libcuda.so.1 (or a symbol it needs)
        raise CudaUnavailable(f"no usable NVIDIA driver ({error})") from None
    error = result[0]
    if error == driver.CUresult.CUDA_ERROR_NO_DEVICE:
        raise CudaUnavailable("the NVIDIA driver reports no CUDA device")
    if error == driver.CUresult.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        raise CudaUnavailable("the NVIDIA kernel module and the user-mode driver (libcuda) have different versions")
    _check(driver, result, "cuInit")
    version = _check(driver, driver.cuDriverGetVersion(), "cuDriverGetVersion")
    major_version, minor_version = version // 1000, (version % 1000) // 10
    if major_version < MIN_DRIVER_CUDA:
        # The kernels are built by (and NVRTC is pinned to) CUDA 13.0, whose cubins a CUDA 12 driver
        # cannot load.
        raise CudaUnavailable(f"the NVIDIA driver supports CUDA {major_version}.{minor_version}; the kernels need "
                              f"CUDA {MIN_DRIVER_CUDA} or newer (driver 580 or newer)")
    count = _check(driver, driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if count == 0:
        raise CudaUnavailable("the NVIDIA driver reports no CUDA device")
    if not 0 <= device < count:
        raise CudaUnavailable(f"device {device} does not exist ({count} device(s))")
    handle = _check(driver, driver.cuDeviceGet(device), "cuDeviceGet")
    attribute = driver.CUdevice_attribute
    major = _check(driver, driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle),
                   "cuDeviceGetAttribute")
    minor = _check(driver, driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle),
                   "cuDeviceGetAttribute")
    name = _check(driver, driver.cuDeviceGetName(64, handle), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    description = f"{name} (sm_{major}{minor}), driver CUDA {major_version}.{minor_version}"
    return driver, handle, description, (major, minor)


def _binary_plan(capability):
    """How the kernels would be obtained on a device of `capability`, without doing it."""
    suffix = "cubin" if capability == (9, 0) else "ptx"
    built = [name for name in KERNEL_FILES if _find_file(f"{name}.{suffix}")]
    if capability >= (9, 0) and len(built) == len(KERNEL_FILES):
        return "cubin" if capability == (9, 0) else "PTX (compute_90, JIT)"
    nvrtc_version()
    if kernel_source_directory() is None:
        raise CudaUnavailable("no built kernels and no kernel sources next to the oga package")
    return "NVRTC at first use"


_status_lock = threading.Lock()
_status = None


def cuda_status(device=0, refresh=False):
    """(available, reason): whether the device kernels can run on `device`, and a description of
    the device and of how the kernels would be loaded, or why they cannot. Probes the driver once
    (cached; ``refresh=True`` probes again) and compiles nothing."""
    global _status
    with _status_lock:
        if _status is not None and not refresh and _status[0] == device:
            return _status[1]
        try:
            _, _, description, capability = _probe_device(device)
            if capability < (7, 5):
                raise CudaUnavailable(f"{description}: compute capability 7.5 or newer is needed")
            result = (True, f"{description}; kernels: {_binary_plan(capability)}")
        except CudaUnavailable as error:
            result = (False, error.reason)
        except Exception as error:  # noqa: BLE001 -- a status query reports, never raises
            result = (False, f"CUDA probe failed: {type(error).__name__}: {error}")
        _status = (device, result)
        return result


def _dtype_suffix(dtype):
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    suffixes = {"float32": "f32", "float16": "f16"}
    if name not in suffixes:
        raise ValueError(f"logits dtype must be float32 or float16, not {name}")
    return suffixes[name]


def _count(value, what):
    value = int(value)
    if value < 0:
        raise ValueError(f"{what} must be 0 or more, not {value}")
    return value


def _block_size(block):
    block = int(block)
    if block < 32 or block > 1024 or block % 32:
        raise ValueError(f"block size must be a multiple of 32 from 32 to 1024, not {block}")
    return block


_MAX_GRID_YZ = 65535


class KernelLaunches:
    """The typed launches of every kernel. Subclasses provide ``_launch(name, grid, block,
    shared_bytes, stream, params)``, where `params` is a ctypes array of pointers to the arguments
    (cuLaunchKernel's kernelParams). Logits are rows of `row_stride` elements; `logits_rows` (a
    device int32 array, 0 for none) maps batch row i to the logits row it reads."""

    def _launch(self, name, grid, block, shared_bytes, stream, params):
        raise NotImplementedError

    def _enqueue(self, name, grid, block, shared_bytes, stream, args):
        values = [ctype(value) for ctype, value in args]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        self._launch(name, grid, block, shared_bytes, int(stream), params)

    # sampling.cu

    def argmax(self, logits, row_stride, vocab_size, num_rows, tokens, *, dtype="float32", logits_rows=0,
               block=1024, stream=0):
        """tokens[i] (int32) = the lowest index of the largest logit of row i, -1 when every logit
        is -inf or NaN."""
        num_rows = _count(num_rows, "num_rows")
        if num_rows == 0:
            return
        self._enqueue(f"oga_argmax_{_dtype_suffix(dtype)}", (num_rows, 1, 1), (_block_size(block), 1, 1), 0, stream, [
            (ctypes.c_void_p, logits), (ctypes.c_longlong, row_stride), (ctypes.c_int, vocab_size),
            (ctypes.c_int, num_rows), (ctypes.c_void_p, logits_rows), (ctypes.c_void_p, tokens)])

    def sample(self, logits, row_stride, vocab_size, num_rows, temperatures, top_ks, top_ps, seeds, counters, tokens,
               next_counters, *, dtype="float32", logits_rows=0, block=1024, stream=0):
        """Per-row selection: greedy when temperatures[i] <= 0 or top_ks[i] == 1, else a draw with
        temperature, top_k (0 = off), top_p (1 = off) from Philox stream seeds[i] (uint64) at
        counters[i] (uint64). Writes tokens[i] (int32, -1: no candidate) and next_counters[i]
        (counters[i] + 1 for a row that drew, else counters[i]; may alias counters)."""
        num_rows = _count(num_rows, "num_rows")
        if num_rows == 0:
            return
        self._enqueue(f"oga_sample_{_dtype_suffix(dtype)}", (num_rows, 1, 1), (_block_size(block), 1, 1), 0, stream, [
            (ctypes.c_void_p, logits), (ctypes.c_longlong, row_stride), (ctypes.c_int, vocab_size),
            (ctypes.c_int, num_rows), (ctypes.c_void_p, logits_rows), (ctypes.c_void_p, temperatures),
            (ctypes.c_void_p, top_ks), (ctypes.c_void_p, top_ps), (ctypes.c_void_p, seeds),
            (ctypes.c_void_p, counters), (ctypes.c_void_p, tokens), (ctypes.c_void_p, next_counters)])

    # logits_processing.cu (in place; run mask_eos, then repetition_penalty, as the CPU engine does)

    def mask_eos(self, logits, row_stride, vocab_size, num_rows, generated, min_generated, eos_ids, num_eos, *,
                 dtype="float32", logits_rows=0, stream=0):
        """Sets the EOS ids (int32 array of num_eos) of every row with generated[i] < min_generated[i]
        (int32 arrays) to -inf."""
        num_rows = _count(num_rows, "num_rows")
        num_eos = _count(num_eos, "num_eos")
        if num_rows == 0 or num_eos == 0:
            return
        threads = 256
        blocks = min((num_rows * num_eos + threads - 1) // threads, 65535)
        self._enqueue(f"oga_mask_eos_{_dtype_suffix(dtype)}", (blocks, 1, 1), (threads, 1, 1), 0, stream, [
            (ctypes.c_void_p, logits), (ctypes.c_longlong, row_stride), (ctypes.c_int, vocab_size),
            (ctypes.c_int, num_rows), (ctypes.c_void_p, logits_rows), (ctypes.c_void_p, generated),
            (ctypes.c_void_p, min_generated), (ctypes.c_void_p, eos_ids), (ctypes.c_int, num_eos)])

    def repetition_penalty(self, logits, row_stride, vocab_size, num_rows, penalties, history_offsets,
                           history_tokens, *, dtype="float32", logits_rows=0, block=256, stream=0):
        """Penalizes every distinct token of row i's history (int32 tokens
        history_tokens[history_offsets[i]:history_offsets[i + 1]], int64 offsets) by penalties[i]
        (float32): positive logits divided, others multiplied."""
        num_rows = _count(num_rows, "num_rows")
        if num_rows == 0:
            return
        name = f"oga_repetition_penalty_{_dtype_suffix(dtype)}"
        shared_bytes = 4 * ((int(vocab_size) + 31) // 32)
        self._reserve_shared(name, shared_bytes)
        self._enqueue(name, (num_rows, 1, 1), (_block_size(block), 1, 1), shared_bytes, stream, [
            (ctypes.c_void_p, logits), (ctypes.c_longlong, row_stride), (ctypes.c_int, vocab_size),
            (ctypes.c_int, num_rows), (ctypes.c_void_p, logits_rows), (ctypes.c_void_p, penalties),
            (ctypes.c_void_p, history_offsets), (ctypes.c_void_p, history_tokens)])

    def _reserve_shared(self, name, shared_bytes):
        """Lets `name` use `shared_bytes` of dynamic shared memory (the device needs an opt-in
        above 48 KiB)."""

    # state_copy.cu: buffers are described by device arrays of uint64 (source bases, destination
    # bases, row or block sizes in bytes); `max_bytes` (the largest of those sizes, known to the
    # host) only shapes the grid.

    def _copy_grid(self, max_bytes, items, num_buffers):
        per_row = max(1, min((int(max_bytes) + 16 * 256 - 1) // (16 * 256), 1024))
        return (per_row, min(items, _MAX_GRID_YZ), min(num_buffers, _MAX_GRID_YZ))

    def _copy(self, name, src_bases, dst_bases, sizes, num_buffers, indices, count, max_bytes, stream):
        num_buffers = _count(num_buffers, "num_buffers")
        count = _count(count, "count")
        if num_buffers == 0 or count == 0 or int(max_bytes) == 0:
            return
        self._enqueue(name, self._copy_grid(max_bytes, count, num_buffers), (256, 1, 1), 0, stream, [
            (ctypes.c_void_p, src_bases), (ctypes.c_void_p, dst_bases), (ctypes.c_void_p, sizes),
            (ctypes.c_int, num_buffers), (ctypes.c_void_p, indices), (ctypes.c_int, count)])

    def gather_rows(self, src_bases, dst_bases, row_bytes, num_buffers, rows, num_rows, *, max_row_bytes, stream=0):
        """Row i of each destination <- row rows[i] (int32) of its source; rows[i] < 0 writes zeros."""
        self._copy("oga_gather_rows", src_bases, dst_bases, row_bytes, num_buffers, rows, num_rows, max_row_bytes,
                   stream)

    def scatter_rows(self, src_bases, dst_bases, row_bytes, num_buffers, rows, num_rows, *, max_row_bytes, stream=0):
        """Row rows[i] (int32) of each destination <- row i of its source; rows[i] < 0 is skipped."""
        self._copy("oga_scatter_rows", src_bases, dst_bases, row_bytes, num_buffers, rows, num_rows, max_row_bytes,
                   stream)

    def copy_blocks(self, src_bases, dst_bases, block_bytes, num_buffers, pairs, num_pairs, *, max_block_bytes,
                    stream=0):
        """Block pairs[2p + 1] of each destination <- block pairs[2p] (int32 pairs) of its source."""
        self._copy("oga_copy_blocks", src_bases, dst_bases, block_bytes, num_buffers, pairs, num_pairs,
                   max_block_bytes, stream)


class CudaKernels(KernelLaunches):
    """The kernels loaded on one device, in its primary context (the one ONNX Runtime's CUDA
    execution provider and the CUDA runtime use, so device pointers from either are valid here)."""

    def __init__(self, device=0, ways=("cubin", "ptx", "nvrtc")):
        """`ways`: which of the three ways of obtaining the kernels may be tried (tests name one)."""
        self._ways = tuple(ways)
        driver, handle, description, capability = _probe_device(device)
        if capability < (7, 5):
            raise CudaUnavailable(f"{description}: compute capability 7.5 or newer is needed")
        self._driver = driver
        self.device = device
        self.description = description
        self.capability = capability
        self.context = _check(driver, driver.cuDevicePrimaryCtxRetain(handle), "cuDevicePrimaryCtxRetain")
        self._device_handle = handle
        self._functions = {}
        self._shared_limits = {}
        self.sources = {}  # kernel file -> how it was loaded: "cubin", "ptx" or "nvrtc"
        try:
            self._make_current()
            for name, entries in KERNEL_FILES.items():
                module, self.sources[name] = self._load_module(name, capability)
                for entry in entries:
                    self._functions[entry] = _check(driver, driver.cuModuleGetFunction(module, entry.encode()),
                                                    f"cuModuleGetFunction({entry})")
        except CudaUnavailable as error:
            driver.cuDevicePrimaryCtxRelease(handle)
            raise CudaUnavailable(f"{description}: {error.reason}") from None
        except BaseException:
            driver.cuDevicePrimaryCtxRelease(handle)
            raise

    def _make_current(self):
        _check(self._driver, self._driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def _load_module(self, name, capability):
        driver = self._driver
        failures = []
        candidates = []
        if capability == (9, 0) and "cubin" in self._ways:
            candidates.append(("cubin", _find_file(f"{name}.cubin")))
        if capability >= (9, 0) and "ptx" in self._ways:
            candidates.append(("ptx", _find_file(f"{name}.ptx")))
        for kind, path in candidates:
            if path is None:
                failures.append(f"no {name}.{kind} built")
                continue
            with open(path, "rb") as f:
                image = f.read()
            if kind == "ptx":
                image = image.rstrip(b"\0") + b"\0"
            error, module = driver.cuModuleLoadData(image)
            if error == driver.CUresult.CUDA_SUCCESS:
                return module, kind
            failures.append(f"{path}: {error.name}")
        if "nvrtc" not in self._ways:
            raise CudaUnavailable(f"kernel {name}: {'; '.join(failures) or 'no way to load it was allowed'}")
        try:
            image, _ = compile_kernel(name, arch=f"sm_{capability[0]}{capability[1]}")
        except CudaUnavailable as error:
            tried = f" (after {'; '.join(failures)})" if failures else ""
            raise CudaUnavailable(f"kernel {name}: {error.reason}{tried}") from None
        return _check(driver, driver.cuModuleLoadData(image), f"cuModuleLoadData({name}, NVRTC cubin)"), "nvrtc"

    def _reserve_shared(self, name, shared_bytes):
        if shared_bytes <= _DEFAULT_SHARED_LIMIT or self._shared_limits.get(name, 0) >= shared_bytes:
            return
        attribute = self._driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(self._driver, self._driver.cuFuncSetAttribute(self._functions[name], attribute, shared_bytes),
               f"cuFuncSetAttribute({name}, {shared_bytes} bytes of dynamic shared memory)")
        self._shared_limits[name] = shared_bytes

    def _launch(self, name, grid, block, shared_bytes, stream, params):
        self._make_current()
        _check(self._driver, self._driver.cuLaunchKernel(self._functions[name], *grid, *block, shared_bytes, stream,
                                                         ctypes.addressof(params), 0), f"cuLaunchKernel({name})")

    def close(self):
        """Releases the primary context reference (modules stay loaded until the context goes)."""
        if self.context is not None:
            self._driver.cuDevicePrimaryCtxRelease(self._device_handle)
            self.context = None


_kernels_lock = threading.Lock()
_kernels = {}


def load_kernels(device=0):
    """The kernels on `device` (loaded once per process); CudaUnavailable with the reason when they
    cannot run here."""
    with _kernels_lock:
        if device not in _kernels:
            _kernels[device] = CudaKernels(device)
        return _kernels[device]
