"""The kernels of cuda/ on a CUDA device, against the numpy references of tests/kernel_reference.py:
the cases the CPU emulator runs (test_kernel_emulation.py) plus full-size ones (real vocabularies,
1024-thread blocks, long histories, large state rows), each way of loading the kernels, and rough
timings. Skipped, with the reason, wherever oga.cuda_kernels.cuda_status() says the kernels cannot
run (no cuda-python, no driver, no device, ...); tests/gpu/device_check.sh runs this on a GPU
machine."""
import time

import numpy as np
import pytest

import kernel_reference as ref
import oga.cuda_kernels as ck

AVAILABLE, REASON = ck.cuda_status()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"the CUDA kernels cannot run here: {REASON}")


class DeviceBuffer:
    def __init__(self, ptr, shape, dtype):
        self.ptr, self.shape, self.dtype = ptr, shape, dtype


class DeviceMemory:
    """Device arrays through the driver API, in the kernels' (primary) context."""

    def __init__(self, kernels):
        self._kernels = kernels
        self._driver = kernels._driver
        self._buffers = []

    def _check(self, result, what):
        return ck._check(self._driver, result, what)

    def put(self, array):
        array = np.ascontiguousarray(array)
        self._kernels._make_current()
        ptr = int(self._check(self._driver.cuMemAlloc(max(array.nbytes, 1)), "cuMemAlloc"))
        self._buffers.append(ptr)
        if array.nbytes:
            self._check(self._driver.cuMemcpyHtoD(ptr, array.ctypes.data, array.nbytes), "cuMemcpyHtoD")
        return DeviceBuffer(ptr, array.shape, array.dtype)

    def empty(self, count, dtype):
        return self.put(np.zeros(count, dtype=dtype))

    def get(self, buffer):
        self.sync()
        out = np.empty(buffer.shape, dtype=buffer.dtype)
        if out.nbytes:
            self._check(self._driver.cuMemcpyDtoH(out.ctypes.data, buffer.ptr, out.nbytes), "cuMemcpyDtoH")
        return out

    def sync(self):
        self._kernels._make_current()
        self._check(self._driver.cuCtxSynchronize(), "cuCtxSynchronize (a kernel failed)")

    def free(self):
        for ptr in self._buffers:
            self._driver.cuMemFree(ptr)
        self._buffers = []


@pytest.fixture(scope="module")
def kernels():
    loaded = ck.load_kernels()
    print(f"\n{loaded.description}; loaded as {loaded.sources}")
    return loaded


@pytest.fixture
def mem(kernels):
    memory = DeviceMemory(kernels)
    yield memory
    memory.free()


@pytest.mark.parametrize("way", ["cubin", "ptx", "nvrtc"])
def test_each_way_of_loading_gives_working_kernels(way):
    """cubin (nvcc, sm_90), PTX (nvcc, compute_90, JIT by the driver), NVRTC (run time). The nvcc
    ways need binaries built in this tree or the installed package (device_check.sh builds them
    when the machine has nvcc)."""
    try:
        kernels = ck.CudaKernels(0, ways=(way,))
    except ck.CudaUnavailable as error:
        if way != "nvrtc" and "built" in error.reason:
            pytest.skip(f"no nvcc-built {way} here: {error.reason}")
        raise
    try:
        assert set(kernels.sources.values()) == {way}
        memory = DeviceMemory(kernels)
        rng = np.random.default_rng(1)
        ref.check_argmax(memory, kernels, rng.standard_normal((4, 1000)).astype(np.float32))
        ref.check_sampling_cases(memory, kernels, rng, vocab=300, rows=16, draws=1)
        memory.free()
    finally:
        kernels.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("vocab,block", [(517, 32), (517, 96), (49152, 1024), (151936, 1024), (151936, 256)])
def test_argmax(kernels, mem, dtype, vocab, block):
    rng = np.random.default_rng(vocab + block)
    logits = rng.integers(-3, 3, size=(9, vocab)).astype(dtype)
    logits[1] = -np.inf
    logits[2] = np.nan
    logits[3, : vocab // 2] = np.nan
    logits[4, vocab - 1] = 100
    ref.check_argmax(mem, kernels, logits, block=block)
    ref.check_argmax(mem, kernels, logits, block=block, logits_rows=[8, 0, 2, 2, 5])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("vocab,block", [(1, 32), (7, 64), (40, 32), (300, 96), (2051, 128), (49152, 1024),
                                         (151936, 1024)])
def test_sampling_follows_the_reference(kernels, mem, dtype, vocab, block):
    rng = np.random.default_rng(vocab * 7 + block)
    rows, draws = (24, 3) if vocab < 10000 else (16, 2)
    agreement = ref.check_sampling_cases(mem, kernels, rng, vocab=vocab, rows=rows, draws=draws, dtype=dtype,
                                         block=block)
    assert agreement > 0.9


def test_a_draw_is_a_function_of_seed_and_counter(kernels, mem):
    rng = np.random.default_rng(5)
    logits = np.repeat(rng.standard_normal((1, 49152)).astype(np.float32), 64, axis=0)
    params = ([1.0] * 64, [0] * 64, [0.95] * 64, [99] * 64)
    counters = np.arange(64, dtype=np.uint64) * 3
    first, _ = ref.check_sample(mem, kernels, logits, *params, counters)
    again, _ = ref.check_sample(mem, kernels, logits, *params, counters)
    later, _ = ref.check_sample(mem, kernels, logits, *params, counters + 1)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, later)


@pytest.mark.parametrize("top_k,top_p,temperature", [(0, 1.0, 1.0), (6, 1.0, 0.7), (0, 0.8, 1.3), (5, 0.9, 1.0)])
def test_sampling_distribution(kernels, mem, top_k, top_p, temperature):
    rng = np.random.default_rng(top_k + 17)
    vocab, draws = 24, 20000
    row = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    device_logits = mem.put(row[None, :])
    tokens = mem.empty(draws, np.int32)
    next_counters = mem.empty(draws, np.uint64)
    kernels.sample(device_logits.ptr, vocab, vocab, draws, mem.put(np.full(draws, temperature, np.float32)).ptr,
                   mem.put(np.full(draws, top_k, np.int32)).ptr, mem.put(np.full(draws, top_p, np.float32)).ptr,
                   mem.put(np.full(draws, 2024, np.uint64)).ptr, mem.put(np.arange(draws, dtype=np.uint64)).ptr,
                   tokens.ptr, next_counters.ptr, logits_rows=mem.put(np.zeros(draws, np.int32)).ptr, block=32)
    tokens = mem.get(tokens)
    ref.check_sample_distribution(tokens, row, temperature, top_k, top_p)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_mask_eos(kernels, mem, dtype):
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((6, 151936)) * 4).astype(dtype)
    ref.check_mask_eos(mem, kernels, logits, [0, 5, 3, 9], [2, 5, 4, 0], [1, 7, 151935, 151936, -3],
                       logits_rows=[5, 1, 0, 3])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("vocab,block", [(300, 32), (151936, 256), (151936, 1024), (600000, 256)])
def test_repetition_penalty(kernels, mem, dtype, vocab, block):
    """600000 tokens needs 75 KB of bitmap: above the 48 KB default, so the loader opts in."""
    rng = np.random.default_rng(vocab + block)
    logits = (rng.standard_normal((4, vocab)) * 4).astype(dtype)
    histories = [rng.integers(-2, vocab + 10, size=n) for n in (0, 1, 500, 8000)]
    ref.check_repetition_penalty(mem, kernels, logits, [1.3, 1.0, 0.7, 2.0], histories, logits_rows=[3, 2, 0, 1],
                                 block=block)


@pytest.mark.parametrize("row_bytes", [[16, 48, 4096], [3, 5, 7], [8, 24], [4, 12, 1000], [20000],
                                       [1 << 20, 3 * 65536 + 8]])
def test_copies(kernels, mem, row_bytes):
    ref.check_copies(mem, kernels, np.random.default_rng(len(row_bytes)), row_bytes=row_bytes, num_rows=6,
                     num_slots=13)


def test_copies_loop_when_the_grid_is_smaller_than_the_work(kernels, mem, monkeypatch):
    monkeypatch.setattr(kernels, "_copy_grid", lambda max_bytes, items, num_buffers: (3, 2, 2))
    ref.check_copies(mem, kernels, np.random.default_rng(9), row_bytes=[64, 40, 7, 160], num_rows=7, num_slots=15)


def _time(mem, launch, repeat=20):
    launch()
    mem.sync()
    start = time.perf_counter()
    for _ in range(repeat):
        launch()
    mem.sync()
    return (time.perf_counter() - start) / repeat * 1e6


def test_report_timings(kernels, mem):
    """Not a performance assertion: microseconds per launch, printed for the device check's log."""
    rows, vocab = 64, 151936
    rng = np.random.default_rng(0)
    logits = mem.put((rng.standard_normal((rows, vocab)) * 3).astype(np.float16))
    tokens, counters = mem.empty(rows, np.int32), mem.put(np.arange(rows, dtype=np.uint64))
    seeds = mem.put(np.arange(rows, dtype=np.uint64))
    results = {}
    for label, top_k, top_p, temperature in [("greedy", 0, 1.0, 0.0), ("temperature", 0, 1.0, 0.8),
                                             ("top_k 50", 50, 1.0, 0.8), ("top_p 0.9", 0, 0.9, 0.8),
                                             ("top_k 50 + top_p 0.9", 50, 0.9, 0.8)]:
        temperatures = mem.put(np.full(rows, temperature, np.float32))
        top_ks, top_ps = mem.put(np.full(rows, top_k, np.int32)), mem.put(np.full(rows, top_p, np.float32))
        results[label] = _time(mem, lambda: kernels.sample(logits.ptr, vocab, vocab, rows, temperatures.ptr, top_ks.ptr,
                                                           top_ps.ptr, seeds.ptr, counters.ptr, tokens.ptr,
                                                           counters.ptr, dtype="float16"))
    history = mem.put(rng.integers(0, vocab, size=rows * 2048).astype(np.int32))
    offsets = mem.put((np.arange(rows + 1) * 2048).astype(np.int64))
    penalties = mem.put(np.full(rows, 1.1, np.float32))
    results["repetition penalty (2048 tokens a row)"] = _time(
        mem, lambda: kernels.repetition_penalty(logits.ptr, vocab, vocab, rows, penalties.ptr, offsets.ptr,
                                                history.ptr, dtype="float16"))
    state = mem.put(np.zeros((rows, 1 << 16), np.uint8))
    bank = mem.put(np.zeros((rows, 1 << 16), np.uint8))
    bases = mem.put(np.array([state.ptr], np.uint64)), mem.put(np.array([bank.ptr], np.uint64))
    sizes = mem.put(np.array([1 << 16], np.uint64))
    indices = mem.put(np.arange(rows, dtype=np.int32)[::-1].copy())
    results["gather 64 rows of 64 KiB"] = _time(
        mem, lambda: kernels.gather_rows(bases[0].ptr, bases[1].ptr, sizes.ptr, 1, indices.ptr, rows,
                                         max_row_bytes=1 << 16))
    print(f"\n{rows} rows x {vocab} fp16 logits, {kernels.description}:")
    for label, microseconds in results.items():
        print(f"  {label:40s} {microseconds:9.1f} us")
