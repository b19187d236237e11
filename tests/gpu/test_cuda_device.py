"""oga.device.CudaDevice and oga.device_ops.DeviceOps on a CUDA device: memory, pinned staging,
errors, batched copies (one gather launch, staging reused while earlier copies are still queued),
read-back, and batched sampling at full size against the numpy references of
tests/kernel_reference.py; the Cython table over a CUDA DeviceOps; rough timings. The same
operations run on the CPU emulator in tests/test_device_ops.py. Skipped, with the reason, wherever
oga.cuda_kernels.cuda_status() says the kernels cannot run."""
import ctypes
import threading
import time

import numpy as np
import pytest

import kernel_reference as ref
import oga.cuda_kernels as ck

AVAILABLE, REASON = ck.cuda_status()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"the CUDA kernels cannot run here: {REASON}")


@pytest.fixture(scope="module")
def device():
    from oga.device import CudaDevice

    cuda = CudaDevice(0)
    print(f"\n{cuda.name}; kernels loaded as {cuda.kernels.sources}")
    yield cuda
    cuda.close()


@pytest.fixture
def ops(device):
    from oga.device_ops import DeviceOps

    operations = DeviceOps(device)
    yield operations
    operations.close()


def test_memory_round_trips(device):
    rng = np.random.default_rng(0)
    host = rng.integers(0, 256, size=4096, dtype=np.uint8)
    live = device.live_allocations()
    a, b = device.allocate(4096), device.allocate(4096)
    assert a % 256 == 0 and b % 256 == 0
    device.upload(a, host.ctypes.data, 4096)
    device.copy(b, a, 4096)
    device.fill_zero(b + 100, 50)
    want = host.copy()
    want[100:150] = 0
    np.testing.assert_array_equal(ref.device_read(device, b, 4096, np.uint8), want)

    pinned = device.host_buffer(1 << 20)
    assert pinned.dtype == np.uint8 and pinned.shape == (1 << 20,)
    from cuda.bindings import runtime

    error, attributes = runtime.cudaPointerGetAttributes(pinned.ctypes.data)
    assert error == runtime.cudaError_t.cudaSuccess
    assert attributes.type == runtime.cudaMemoryType.cudaMemoryTypeHost  # page-locked, known to CUDA
    pinned[:4096] = host[::-1]
    device.upload(a, pinned.ctypes.data, 4096)
    np.testing.assert_array_equal(ref.device_read(device, a, 4096, np.uint8), host[::-1])
    del pinned  # frees it (cudaFreeHost)

    device.release(a)
    device.release(b)
    assert device.live_allocations() == live


def test_errors_are_typed_and_leave_the_device_working(device, ops):
    from cuda.bindings import runtime

    from oga.device import DeviceError, DeviceOutOfMemory

    with pytest.raises(DeviceOutOfMemory, match="cudaErrorMemoryAllocation"):
        device.allocate(1 << 50)
    # The failure does not linger as the runtime's last error (ONNX Runtime checks it).
    assert runtime.cudaGetLastError()[0] == runtime.cudaError_t.cudaSuccess
    assert ops.allocate(1 << 50) == 0
    with pytest.raises(DeviceError, match="not allocated here"):
        device.release(0x1234)
    address = ref.device_array(device, np.arange(16, dtype=np.uint8))
    np.testing.assert_array_equal(ref.device_read(device, address, 16, np.uint8), np.arange(16, dtype=np.uint8))
    device.release(address)


def test_batched_copies_one_launch_and_queued_back_to_back(device, ops):
    """Copies of many rows, each one gather launch, enqueued one after another without waiting:
    every copy's staged addresses must be the ones it was given."""
    rng = np.random.default_rng(3)
    rows, row_bytes = 300, 1000  # not a multiple of 16: narrower accesses
    buffers = [ref.device_array(device, rng.integers(0, 256, size=(rows, row_bytes), dtype=np.uint8))
               for _ in range(3)]
    expected = [ref.device_read(device, b, (rows, row_bytes), np.uint8) for b in buffers]
    for k in range(24):
        source, destination = k % 3, (k + 1) % 3
        permutation = rng.permutation(rows)
        count = int(rng.integers(2, rows + 1))
        sources = np.asarray([buffers[source] + i * row_bytes for i in range(count)], np.uint64)
        destinations = np.asarray([buffers[destination] + int(permutation[i]) * row_bytes for i in range(count)],
                                  np.uint64)
        ops.copy(sources, destinations, row_bytes)
        expected[destination][permutation[:count]] = expected[source][:count]
    ops.synchronize()
    for address, want in zip(buffers, expected):
        np.testing.assert_array_equal(ref.device_read(device, address, (rows, row_bytes), np.uint8), want)
    out = np.zeros((4, row_bytes), np.uint8)
    ops.read(np.asarray([buffers[0] + i * row_bytes for i in (5, 0, 299, 5)], np.uint64),
             np.asarray([out[i].ctypes.data for i in range(4)], np.uint64), row_bytes)
    np.testing.assert_array_equal(out, expected[0][[5, 0, 299, 5]])
    for address in buffers:
        device.release(address)


def sample_case(rng, rows, logits_rows_count, vocab, dtype, eos_ids):
    logits = (rng.standard_normal((logits_rows_count, vocab)) * 3).astype(dtype)
    logits[:, eos_ids[0]] = 40  # EOS is every row's best: masked rows must not pick it
    logits_rows = rng.integers(0, logits_rows_count, size=rows)
    temperatures = rng.choice([0.0, 0.7, 1.0, 1.4], size=rows)
    top_ks = rng.choice([0, 0, 1, 20, 50], size=rows)
    top_ps = rng.choice([1.0, 0.9, 0.5], size=rows)
    seeds = rng.integers(0, 2**63, size=rows)
    counters = rng.integers(0, 2**40, size=rows)
    mask_eos = rng.random(rows) < 0.4
    penalties = rng.choice([1.0, 1.0, 1.3, 0.8, 5.0], size=rows)
    histories = [rng.integers(0, vocab, size=int(rng.integers(0, 3000))) for _ in range(rows)]
    return (logits, vocab, logits_rows, temperatures, top_ks, top_ps, seeds, counters, mask_eos, eos_ids, penalties,
            histories)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("vocab,rows", [(300, 24), (32000, 48), (151936, 16)])
def test_sample_follows_the_reference(ops, dtype, vocab, rows):
    rng = np.random.default_rng(vocab + rows)
    tokens = ref.check_device_ops_sample(ops, *sample_case(rng, rows, 12, vocab, dtype, [2, vocab - 1]))
    assert len(set(tokens.tolist())) > 1


def test_sample_from_another_thread(ops):
    """The engine's owner thread need not be the one that made the device."""
    rng = np.random.default_rng(9)
    failures = []

    def run():
        try:
            ref.check_device_ops_sample(ops, *sample_case(rng, 8, 4, 4000, np.float32, [1]))
        except BaseException as error:  # noqa: BLE001 -- reported by the test thread
            failures.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not failures, failures


def test_the_cython_table_samples_on_the_device(device, ops):
    from oga import _core
    from test_device_ops import DeviceOpsTable, Sampling

    table_object = _core._device_ops_table(ops)
    table = ctypes.cast(table_object.address, ctypes.POINTER(DeviceOpsTable)).contents
    rng = np.random.default_rng(4)
    vocab, rows = 32000, 5
    logits = rng.standard_normal((rows, vocab)).astype(np.float16)
    address = ref.device_array(device, logits)
    arrays = dict(logits_rows=np.arange(rows, dtype=np.int32)[::-1].copy(), temperatures=np.zeros(rows, np.float32),
                  top_ks=np.zeros(rows, np.int32), top_ps=np.ones(rows, np.float32), seeds=np.zeros(rows, np.uint64),
                  counters=np.zeros(rows, np.uint64), mask_eos=np.zeros(rows, np.int32),
                  eos_ids=np.zeros(1, np.int32), repetition_penalties=np.ones(rows, np.float32),
                  history_offsets=np.zeros(rows + 1, np.int64), history_tokens=np.zeros(1, np.int32),
                  tokens=np.full(rows, -7, np.int32))
    sampling = Sampling(num_rows=rows, logits=address, logits_type=1, logits_row_stride=vocab, vocab_size=vocab,
                        num_eos=0, **{k: v.ctypes.data for k, v in arrays.items()})
    message = ctypes.create_string_buffer(256)
    assert table.sample(table.context, ctypes.byref(sampling), message, 256) == 0, message.value
    want = [ref.reference_argmax(logits[r].astype(np.float32)) for r in arrays["logits_rows"]]
    assert arrays["tokens"].tolist() == want
    device.release(address)


def test_report_timings(device, ops):
    """Not a performance assertion: milliseconds per sample call (upload, kernels, download and the
    Python around them), printed for the device check's log."""
    rng = np.random.default_rng(0)
    vocab = 151936
    for rows, processed in ((1, False), (64, False), (64, True), (256, False), (256, True)):
        case = list(sample_case(rng, rows, rows, vocab, np.float16, [2]))
        logits = case[0]
        case[8] = np.full(rows, processed)  # mask_eos
        case[10] = np.full(rows, 1.2 if processed else 1.0)  # penalties
        case[11] = [rng.integers(0, vocab, size=512) for _ in range(rows)]
        address = ref.device_array(device, logits)
        offsets = np.zeros(rows + 1, np.int64)
        offsets[1:] = np.cumsum([len(h) for h in case[11]])
        history = np.concatenate(case[11]).astype(np.int32)
        tokens = np.empty(rows, np.int32)
        args = (rows, address, 1, vocab, vocab, case[2].astype(np.int32), case[3].astype(np.float32),
                case[4].astype(np.int32), case[5].astype(np.float32), case[6].astype(np.uint64),
                case[7].astype(np.uint64), case[8].astype(np.int32), np.asarray([2], np.int32),
                case[10].astype(np.float32), offsets, history, tokens)
        ops.sample(*args)  # sizes the staging and scratch
        repeat = 10
        start = time.perf_counter()
        for _ in range(repeat):
            ops.sample(*args)
        elapsed = (time.perf_counter() - start) / repeat * 1e3
        print(f"sample {rows} rows x {vocab} fp16, {'all' if processed else 'no'} rows processed: {elapsed:.2f} ms")
        device.release(address)
