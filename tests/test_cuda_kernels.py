"""The device kernels without a device: every cuda/*.cu compiles with NVRTC for compute_90 without a
warning and gives PTX the target driver (580, CUDA 13.0: PTX ISA 9.0 at most) can load; Philox
compiled as host C++ gives Random123's known answers and the engine's uniform formula; the loader
imports and reports cleanly wherever CUDA is missing; the build compiles kernels with nvcc when
there is one and still succeeds without. The kernels' results are tested on the CPU emulator in
test_kernel_emulation.py and on a device in tests/gpu."""
import ctypes
import glob
import os
import subprocess
import sys
import textwrap

import pytest

import oga.cuda_kernels as ck
from kernel_reference import philox4x32_10, philox_uniform

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
CUDA_DIR = os.path.join(REPO, "cuda")
sys.path.insert(0, CUDA_DIR)
import build_kernels  # noqa: E402  (cuda/build_kernels.py)

MAX_PTX_ISA = (9, 0)  # what driver 580 (CUDA 13.0) loads

# Random123's published known answers for philox4x32_10 (its kat_vectors): counter, key, output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_every_kernel_file_is_known_to_the_loader():
    names = sorted(os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(CUDA_DIR, "*.cu")))
    assert names == sorted(ck.KERNEL_FILES)


@pytest.mark.parametrize("name", sorted(ck.KERNEL_FILES))
def test_kernel_compiles_with_nvrtc_for_compute_90_without_warnings(name):
    ptx, log = ck.compile_kernel(name, arch="compute_90", source_dir=CUDA_DIR)
    # NVRTC has no -Werror; any diagnostic in its log fails the test instead.
    assert log == "", f"NVRTC {ck.nvrtc_version()} diagnostics for {name}.cu:\n{log}"
    assert ck.ptx_isa_version(ptx) <= MAX_PTX_ISA, (
        f"NVRTC {ck.nvrtc_version()} emits PTX ISA {ck.ptx_isa_version(ptx)}; driver 580 loads up to 9.0 "
        "(install nvidia-cuda-nvrtc==13.0.88)")
    text = ptx.decode()
    entries = sorted(set(line.split()[-1].rstrip("(") for line in text.splitlines() if ".entry" in line))
    assert entries == sorted(ck.KERNEL_FILES[name])
    assert ".target sm_90" in text
    # NVRTC wrote its (one-byte) log into a fresh buffer, not into the interpreter's b" " singleton.
    assert bytes((32,))[0] == 32 and " ".encode() == bytes((32,))


@pytest.mark.parametrize("arch", ["sm_90", "compute_75"])
def test_kernels_compile_for_the_run_time_targets(arch):
    """NVRTC at run time makes an sm_XY cubin for the device at hand (7.5 is NVRTC 13's oldest)."""
    for name in ck.KERNEL_FILES:
        binary, log = ck.compile_kernel(name, arch=arch, source_dir=CUDA_DIR)
        assert log == "", f"{name}.cu for {arch}:\n{log}"
        if arch.startswith("sm_"):
            assert binary[:4] == b"\x7fELF"
        else:
            assert ck.ptx_isa_version(binary) <= MAX_PTX_ISA


def test_a_kernel_that_does_not_compile_is_reported_with_the_nvrtc_log(tmp_path):
    for header in glob.glob(os.path.join(CUDA_DIR, "*.cuh")):
        (tmp_path / os.path.basename(header)).write_bytes(open(header, "rb").read())
    (tmp_path / "broken.cu").write_text('#include "device_support.cuh"\nextern "C" __global__ void k() { oops; }\n')
    with pytest.raises(ck.CudaUnavailable, match='identifier "oops" is undefined'):
        ck.compile_kernel("broken", source_dir=str(tmp_path))


PHILOX_HOST = textwrap.dedent("""
    #include "philox.cuh"
    extern "C" void philox(const unsigned int* counter, const unsigned int* key, unsigned int* out) {
      const OgaPhiloxBlock block = oga_philox4x32_10(counter[0], counter[1], counter[2], counter[3], key[0], key[1]);
      for (int i = 0; i < 4; ++i) out[i] = block.word[i];
    }
    extern "C" double uniform(unsigned long long seed, unsigned long long n) { return oga_philox_uniform(seed, n); }
""")


@pytest.fixture(scope="module")
def philox_host(tmp_path_factory):
    directory = tmp_path_factory.mktemp("philox")
    source = directory / "philox_host.cpp"
    source.write_text(PHILOX_HOST)
    library = directory / "philox_host.so"
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fPIC", "-shared",
                    f"-I{CUDA_DIR}", str(source), "-o", str(library)], check=True)
    lib = ctypes.CDLL(str(library))
    lib.philox.argtypes = [ctypes.POINTER(ctypes.c_uint32)] * 3
    lib.uniform.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    lib.uniform.restype = ctypes.c_double
    return lib


def _host_philox(lib, counter, key):
    c = (ctypes.c_uint32 * 4)(*counter)
    k = (ctypes.c_uint32 * 2)(*key)
    out = (ctypes.c_uint32 * 4)()
    lib.philox(c, k, out)
    return tuple(out)


@pytest.mark.parametrize("counter,key,expected", KNOWN_ANSWERS)
def test_philox_host_build_gives_the_known_answers(philox_host, counter, key, expected):
    assert _host_philox(philox_host, counter, key) == expected
    assert philox4x32_10(counter, key) == expected  # the Python reference the kernel tests use


SEEDS_AND_DRAWS = [(0, 0), (0, 1), (1, 0), (42, 7), (0xFFFFFFFF, 3), (1 << 32, 3), (0x0123456789ABCDEF, 0),
                   (0x0123456789ABCDEF, (1 << 32) + 5), (2**64 - 1, 2**64 - 1), (12345, 2**40 + 17)]


@pytest.mark.parametrize("seed,n", SEEDS_AND_DRAWS)
def test_philox_uniform_is_the_specified_53_bit_draw(philox_host, seed, n):
    # key = (seed low, seed high), counter = (n low, n high, 0, 0), one counter value per draw.
    out = _host_philox(philox_host, (n & 0xFFFFFFFF, n >> 32, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
    expected = float((out[0] << 21) | (out[1] >> 11)) * 2.0**-53
    got = philox_host.uniform(seed, n)
    assert got == expected == philox_uniform(seed, n)
    assert 0.0 <= got < 1.0


def test_philox_uniform_extremes_and_spread(philox_host):
    draws = [philox_host.uniform(7, n) for n in range(4000)]
    assert min(draws) >= 0.0 and max(draws) < 1.0
    assert abs(sum(draws) / len(draws) - 0.5) < 0.02
    assert len(set(draws)) == len(draws)


def test_importing_the_loader_never_touches_the_driver():
    code = ("import oga.cuda_kernels as ck, sys; "
            "print('cuda.bindings.driver' in sys.modules, ck.CudaUnavailable.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "CudaUnavailable"]


def test_without_cuda_python_the_status_says_so():
    code = ("import sys; sys.modules['cuda'] = None; sys.modules['cuda.bindings'] = None; "
            "import oga.cuda_kernels as ck; print(*ck.cuda_status(), sep='|'); "
            "exec('try:\\n ck.load_kernels()\\nexcept ck.CudaUnavailable as e:\\n print(\"raised\", e.reason)')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert out.returncode == 0, out.stderr
    assert "False|cuda-python is not installed" in out.stdout
    assert "raised cuda-python is not installed" in out.stdout


def test_cuda_status_here_is_a_reason_and_load_agrees():
    available, reason = ck.cuda_status(refresh=True)
    assert isinstance(available, bool) and isinstance(reason, str) and reason
    if available:  # a GPU machine: tests/gpu runs the kernels
        assert "sm_" in reason
    else:
        with pytest.raises(ck.CudaUnavailable) as raised:
            ck.load_kernels()
        assert raised.value.reason == reason


class FakeDriver:
    """Stands in for cuda.bindings.driver: the real enums, scripted answers."""

    def __init__(self, init=None, version=13000, count=1, capability=(9, 0), init_raises=None):
        from cuda.bindings import driver

        self.CUresult = driver.CUresult
        self.CUdevice_attribute = driver.CUdevice_attribute
        self._init = driver.CUresult.CUDA_SUCCESS if init is None else init
        self._init_raises = init_raises
        self._version, self._count, self._capability = version, count, capability
        self.retained = 0

    def cuInit(self, flags):
        if self._init_raises:
            raise RuntimeError(self._init_raises)
        return (self._init,)

    def cuGetErrorName(self, error):
        return (self.CUresult.CUDA_SUCCESS, error.name.encode())

    def cuDriverGetVersion(self):
        return (self.CUresult.CUDA_SUCCESS, self._version)

    def cuDeviceGetCount(self):
        return (self.CUresult.CUDA_SUCCESS, self._count)

    def cuDeviceGet(self, ordinal):
        return (self.CUresult.CUDA_SUCCESS, ordinal)

    def cuDeviceGetAttribute(self, attribute, device):
        major = attribute == self.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        return (self.CUresult.CUDA_SUCCESS, self._capability[0] if major else self._capability[1])

    def cuDeviceGetName(self, length, device):
        return (self.CUresult.CUDA_SUCCESS, b"Fake GPU".ljust(length, b"\0"))

    def cuDevicePrimaryCtxRetain(self, device):
        self.retained += 1
        return (self.CUresult.CUDA_SUCCESS, "context")

    def cuDevicePrimaryCtxRelease(self, device):
        self.retained -= 1
        return (self.CUresult.CUDA_SUCCESS,)

    def cuCtxSetCurrent(self, context):
        return (self.CUresult.CUDA_SUCCESS,)


def _unavailable(monkeypatch, fake, nvrtc_missing=False):
    """The status and the loader's exception with `fake` as the driver: both must give the reason."""
    monkeypatch.setattr(ck, "_import_driver", lambda: fake)
    if nvrtc_missing:
        def missing():
            raise ck.CudaUnavailable("NVRTC cannot be loaded (test)")

        monkeypatch.setattr(ck, "nvrtc_version", missing)
    available, reason = ck.cuda_status(refresh=True)
    assert not available
    with pytest.raises(ck.CudaUnavailable) as raised:
        ck.CudaKernels(0)
    assert reason in raised.value.reason
    return reason


def test_status_and_loader_name_each_missing_piece(monkeypatch):
    from cuda.bindings import driver

    result = driver.CUresult
    try:
        assert _unavailable(monkeypatch, FakeDriver(init_raises="Failed to dlopen libcuda.so.1")) == (
            "no usable NVIDIA driver (Failed to dlopen libcuda.so.1)")
        assert _unavailable(monkeypatch, FakeDriver(init=result.CUDA_ERROR_NO_DEVICE)) == (
            "the NVIDIA driver reports no CUDA device")
        assert "different versions" in _unavailable(
            monkeypatch, FakeDriver(init=result.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH))
        unknown = FakeDriver(init=result.CUDA_ERROR_UNKNOWN)
        assert _unavailable(monkeypatch, unknown) == "cuInit failed: CUDA_ERROR_UNKNOWN"
        assert _unavailable(monkeypatch, FakeDriver(version=12080)) == (
            "the NVIDIA driver supports CUDA 12.8; the kernels need CUDA 13 or newer (driver 580 or newer)")
        assert _unavailable(monkeypatch, FakeDriver(count=0)) == "the NVIDIA driver reports no CUDA device"
        assert "compute capability 7.5 or newer" in _unavailable(monkeypatch, FakeDriver(capability=(7, 0)))
        # A device the nvcc-built binaries do not cover, and no NVRTC to compile for it.
        fake = FakeDriver(capability=(8, 9))
        assert _unavailable(monkeypatch, fake, nvrtc_missing=True) == "NVRTC cannot be loaded (test)"
        assert fake.retained == 0  # the loader gave its context reference back
        # With NVRTC the same device is fine (the status compiles nothing).
        monkeypatch.undo()
        monkeypatch.setattr(ck, "_import_driver", lambda: FakeDriver(capability=(8, 9)))
        assert ck.cuda_status(refresh=True) == (True, "Fake GPU (sm_89), driver CUDA 13.0; kernels: NVRTC at first use")
    finally:
        monkeypatch.undo()
        ck.cuda_status(refresh=True)


def test_kernel_build_with_and_without_nvcc(tmp_path):
    """Without nvcc the build compiles nothing (and says why) but ships the sources; with nvcc
    (when this machine has one) it writes PTX and an sm_90 cubin per kernel file."""
    messages = []
    out = tmp_path / "no_nvcc"
    build = build_kernels.KernelBuild(str(out), source_dir=CUDA_DIR, nvcc=None, log=messages.append).start().finish()
    build_kernels.copy_sources(str(out), CUDA_DIR)
    assert build.skipped and "NVRTC at run time" in messages[0]
    shipped = sorted(os.listdir(out))
    assert shipped == sorted([f"{n}.cu" for n in ck.KERNEL_FILES] + ["device_support.cuh", "philox.cuh"])
    # What was shipped compiles on its own (an installed package has no cuda/ directory).
    _, log = ck.compile_kernel("sampling", source_dir=str(out))
    assert log == ""

    nvcc = build_kernels.find_nvcc()
    if nvcc is None:
        return  # CI without nvcc: the branch above is the one that runs there
    out = tmp_path / "nvcc"
    build_kernels.KernelBuild(str(out), source_dir=CUDA_DIR, nvcc=nvcc, log=messages.append).start().finish()
    for name in ck.KERNEL_FILES:
        assert (out / f"{name}.cubin").read_bytes()[:4] == b"\x7fELF"
        ptx = (out / f"{name}.ptx").read_bytes()
        assert b".target sm_90" in ptx
        if build_kernels.nvcc_version(nvcc) <= (13, 0):
            assert ck.ptx_isa_version(ptx) <= MAX_PTX_ISA


def test_kernel_build_fails_on_a_kernel_nvcc_rejects(tmp_path):
    nvcc = build_kernels.find_nvcc()
    source = tmp_path / "src"
    source.mkdir()
    (source / "broken.cu").write_text('extern "C" __global__ void k(int* x) { int unused; x[0] = 1; }\n')
    build = build_kernels.KernelBuild(str(tmp_path / "out"), source_dir=str(source), nvcc=nvcc, log=lambda m: None)
    build.start()
    if nvcc is None:
        assert build.skipped  # nothing to reject without nvcc
        return
    with pytest.raises(RuntimeError, match="nvcc failed on the oga kernels"):
        build.finish()  # a warning is an error
