"""OgaExtDeviceOps in Python (oga/device_ops.py) over the host device with the kernels of cuda/ on
the CPU emulator (tests/kernel_emulation.py): memory operations against numpy, batched sampling
against the numpy references of tests/kernel_reference.py, the staging's allocation discipline,
the Cython table (oga._core._device_ops_table) called through ctypes as the core calls it, and the
ONNX loader handing a decoder's device ops to the core. Also: oga.device and oga.device_ops import
without touching a driver, and CudaDevice fails with a clear error where CUDA cannot run (the
device itself is tested in tests/gpu/test_device_ops.py)."""
import ctypes
import subprocess
import sys
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int32, c_size_t, c_uint32, c_void_p

import numpy as np
import pytest

import kernel_reference as ref
import oga.cuda_kernels as ck
from kernel_emulation import EmulatedKernels, build_emulated_kernels
from oga import _core
from oga.device import CudaDevice, DeviceError, DeviceOutOfMemory, HostDevice, open_device
from oga.device_ops import DeviceOps

# The emulator runs every CUDA thread as a coroutine: small blocks keep it quick.
SMALL_BLOCKS = dict(sample_block=64, penalty_block=32)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return EmulatedKernels(build_emulated_kernels(str(tmp_path_factory.mktemp("emulated_kernels"))))


class CountingHostDevice(HostDevice):
    """A host device that counts device allocations and pinned staging buffers."""

    def __init__(self, kernels=None):
        super().__init__(kernels)
        self.allocations = 0
        self.host_buffers = 0

    def allocate(self, nbytes):
        self.allocations += 1
        return super().allocate(nbytes)

    def host_buffer(self, nbytes):
        self.host_buffers += 1
        return super().host_buffer(nbytes)


# Importing, and CUDA where there is none


def test_importing_the_device_modules_touches_no_driver():
    code = ("import sys, oga.device, oga.device_ops; "
            "print(sorted(m for m in sys.modules if m == 'cuda' or m.startswith('cuda.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_cuda_device_without_cuda_python_is_a_clear_error(monkeypatch):
    for name in ("cuda.bindings", "cuda.bindings.driver", "cuda.bindings.runtime"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with pytest.raises(ck.CudaUnavailable, match="cuda-python is not installed"):
        CudaDevice()


def test_cuda_device_where_cuda_cannot_run_is_a_clear_error():
    available, reason = ck.cuda_status()
    if available:
        pytest.skip(f"CUDA runs here ({reason}); tests/gpu/test_cuda_device.py covers the device")
    for make in (CudaDevice, lambda: CudaDevice(with_kernels=False), lambda: open_device("cuda")):
        with pytest.raises(ck.CudaUnavailable) as raised:
            make()
        assert raised.value.reason == reason  # the driver probe's own words
    with pytest.raises(ValueError, match="unknown device kind"):
        open_device("tpu")


# Memory operations


@pytest.mark.parametrize("with_kernels", [False, True])
def test_allocate_copy_fill_read(kernels, with_kernels):
    device = HostDevice(kernels if with_kernels else None)
    ops = DeviceOps(device, **SMALL_BLOCKS)
    rng = np.random.default_rng(1)
    rows = [rng.integers(0, 256, size=40, dtype=np.uint8) for _ in range(5)]
    sources = [ref.device_array(device, row) for row in rows]
    destinations = [ops.allocate(40) for _ in rows]
    assert all(d != 0 and d % 64 == 0 for d in destinations)
    launches = len(kernels.launches)

    ops.copy(np.asarray(sources[:4], np.uint64), np.asarray(destinations[:4], np.uint64), 40)  # batched
    ops.copy(np.asarray(sources[4:], np.uint64), np.asarray(destinations[4:], np.uint64), 40)  # single
    ops.synchronize()
    gathers = [launch for launch in kernels.launches[launches:] if launch[0] == "oga_gather_rows"]
    assert len(gathers) == (1 if with_kernels else 0)  # four pairs, one launch; one pair, a plain copy

    out = np.zeros((5, 40), dtype=np.uint8)
    ops.read(np.asarray(destinations, np.uint64), np.asarray([out[i].ctypes.data for i in range(5)], np.uint64), 40)
    np.testing.assert_array_equal(out, np.stack(rows))

    ops.fill_zero(destinations[2] + 8, 16)
    ops.read(np.asarray(destinations[2:3], np.uint64), np.asarray([out[2].ctypes.data], np.uint64), 40)
    want = rows[2].copy()
    want[8:24] = 0
    np.testing.assert_array_equal(out[2], want)

    ops.copy(np.zeros(0, np.uint64), np.zeros(0, np.uint64), 40)  # nothing to do
    for address in sources + destinations:
        ops.release(address)
    ops.close()
    assert device.live_allocations() == 0


def test_allocate_returns_0_when_the_device_is_out_of_memory():
    class FullDevice(HostDevice):
        def allocate(self, nbytes):
            raise DeviceOutOfMemory("full")

    assert DeviceOps(FullDevice()).allocate(64) == 0


def test_batched_copies_wait_for_the_staging_they_reuse(kernels):
    """Copies are asynchronous: before rewriting the pinned staging, a copy waits for the event
    recorded after the previous upload out of it."""
    class EventLog(HostDevice):
        def __init__(self, kernels):
            super().__init__(kernels)
            self.log = []

        def upload(self, destination, source, nbytes):
            self.log.append("upload")
            super().upload(destination, source, nbytes)

        def record_event(self, event):
            self.log.append("record")

        def wait_event(self, event):
            self.log.append("wait")

    device = EventLog(kernels)
    ops = DeviceOps(device)
    a, b = [device.allocate(16) for _ in range(4)], [device.allocate(16) for _ in range(4)]
    device.log.clear()
    ops.copy(np.asarray(a, np.uint64), np.asarray(b, np.uint64), 16)
    ops.copy(np.asarray(b, np.uint64), np.asarray(a, np.uint64), 16)
    assert device.log == ["wait", "upload", "record"] * 2


# Sampling


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_sample_mixed_batch(kernels, dtype):
    """Greedy and sampled rows, top_k and top_p, EOS masking and repetition penalties, rows mapped
    through logits_rows (two batch rows read one logits row, one processed and one not), a stride
    wider than the vocabulary."""
    rng = np.random.default_rng(3 if dtype == np.float32 else 4)
    vocab, stride = 300, 320
    logits = (rng.standard_normal((6, stride)) * 3).astype(dtype)
    logits[:, vocab:] = 1e4  # beyond the vocabulary: never a candidate
    eos_ids = [7, 299]
    logits[2, 7] = 60  # EOS is row 2's best: masked for batch row 1, not for batch row 6
    history_hot = [11, 11, 40, 3]
    logits[4, 11] = 50  # row 4's best is in batch row 3's history: a strong penalty demotes it
    logits[4, 40] = 49
    logits[5, 20] = -5
    logits_rows = [0, 2, 5, 4, 3, 1, 2]
    temperatures = [0.8, 0.0, 1.3, 0.0, 1.0, 0.0, 0.0]
    top_ks = [0, 0, 20, 0, 5, 0, 0]
    top_ps = [0.9, 1.0, 1.0, 1.0, 0.8, 1.0, 1.0]
    seeds = [1, 2, 3, 4, 5, 6, 7]
    counters = [0, 5, 2**33, 9, 1, 0, 3]
    mask_eos = [0, 1, 0, 0, 0, 1, 0]  # with the penalties: unprocessed rows before and between processed ones
    penalties = [1.0, 1.0, 1.5, 100.0, 0.7, 1.0, 1.0]
    histories = [[1, 2], [], [20, 20, 299, -1, 400], history_hot, [0, 5, 5], [9], []]
    ops = DeviceOps(HostDevice(kernels), **SMALL_BLOCKS)
    tokens = ref.check_device_ops_sample(ops, logits, vocab, logits_rows, temperatures, top_ks, top_ps, seeds,
                                         counters, mask_eos, eos_ids, penalties, histories)
    assert tokens[1] != 7 and tokens[6] == 7  # masked copy vs. the original row
    assert tokens[3] not in (11, 40)  # penalized away (greedy)


@pytest.mark.parametrize("processed", ["none", "all"])
def test_sample_with_every_row_or_no_row_processed(kernels, processed):
    rng = np.random.default_rng(8)
    vocab = 200
    logits = (rng.standard_normal((4, vocab)) * 2).astype(np.float32)
    n = 5
    mask = [1] * n if processed == "all" else [0] * n
    penalties = [1.2, 1.0, 2.0, 1.0, 0.5] if processed == "all" else [1.0] * n
    ops = DeviceOps(HostDevice(kernels), **SMALL_BLOCKS)
    launches = len(kernels.launches)
    ref.check_device_ops_sample(ops, logits, vocab, [3, 2, 1, 0, 3], [0.0, 1.0, 0.7, 0.0, 1.5], [0, 8, 0, 0, 3],
                                [1.0, 1.0, 0.85, 1.0, 1.0], [10, 11, 12, 13, 14], [4, 4, 4, 4, 4], mask, [0, 1],
                                penalties, [[5, 6], [7], [8, 8, 9], [], [0, 1, 2]])
    names = [name for name, *_ in kernels.launches[launches:]]
    if processed == "all":  # copied, masked, penalized and sampled in the scratch
        assert names == ["oga_gather_rows", "oga_mask_eos_f32", "oga_repetition_penalty_f32", "oga_sample_f32"]
    else:  # sampled where they are
        assert names == ["oga_sample_f32"]


def test_sample_draws_follow_the_reference_distribution(kernels):
    """One row drawn at many counters: the tokens follow the kept softmax of the penalized row."""
    rng = np.random.default_rng(21)
    vocab, draws = 24, 600
    row = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    logits = row[None, :].copy()
    tokens = np.empty(draws, dtype=np.int32)
    # Every batch row reads logits row 0 and has the same history.
    history = np.tile(np.asarray([3, 4, 4], dtype=np.int32), draws)
    offsets = np.arange(draws + 1, dtype=np.int64) * 3
    ops = DeviceOps(HostDevice(kernels), sample_block=32, penalty_block=32)
    ops.sample(draws, logits.ctypes.data, 0, vocab, vocab, np.zeros(draws, np.int32), np.full(draws, 0.9, np.float32),
               np.full(draws, 6, np.int32), np.ones(draws, np.float32), np.full(draws, 77, np.uint64),
               np.arange(draws, dtype=np.uint64), np.zeros(draws, np.int32), np.zeros(0, np.int32),
               np.full(draws, 1.3, np.float32), offsets, history, tokens)
    penalized = ref.reference_processed_row(logits, 0, vocab, 0, [], 1.3, [3, 4, 4])
    ref.check_sample_distribution(tokens, penalized, 0.9, 6, 1.0)


def test_sample_refuses_a_device_without_kernels():
    ops = DeviceOps(HostDevice())
    assert not ops.samples_on_device
    logits = np.zeros((1, 4), np.float32)
    per_row = [np.zeros(1, t) for t in (np.int32, np.float32, np.int32, np.float32, np.uint64, np.uint64, np.int32)]
    with pytest.raises(DeviceError, match="no kernels"):
        ops.sample(1, logits.ctypes.data, 0, 4, 4, *per_row, np.zeros(0, np.int32), np.ones(1, np.float32),
                   np.zeros(2, np.int64), np.zeros(0, np.int32), np.zeros(1, np.int32))


def test_staging_grows_geometrically_and_steady_steps_allocate_nothing(kernels):
    rng = np.random.default_rng(6)
    vocab = 64
    logits = rng.standard_normal((8, vocab)).astype(np.float32)

    def setup():
        device = CountingHostDevice(kernels)
        return device, DeviceOps(device, **SMALL_BLOCKS), ref.device_array(device, logits)

    def step(n, history=2):
        # Every row masked and penalized: the scratch is used by every step.
        ref.check_device_ops_sample(ops, logits, vocab, list(range(n)), [0.0] * n, [0] * n, [1.0] * n,
                                    list(range(n)), [0] * n, [1] * n, [1], [1.1] * n,
                                    [[1] * history for _ in range(n)], address=address)

    def allocations():
        return device.allocations, device.host_buffers

    device, ops, address = setup()
    before = allocations()
    step(4)
    first = allocations()
    assert first[0] > before[0] and first[1] > before[1]
    for n in (4, 2, 3, 4, 1):
        step(n)
    assert allocations() == first  # nothing per step once sized
    step(8, history=3)  # a larger batch grows the staging and the scratch once
    grown = allocations()
    assert grown[0] > first[0]
    for n in (8, 5, 8):
        step(n, history=3)
    assert allocations() == grown

    # Copies: the staging of batched copies grows the same way.
    sources = [device.allocate(32) for _ in range(6)]
    destinations = [device.allocate(32) for _ in range(6)]
    ops.copy(np.asarray(sources[:3], np.uint64), np.asarray(destinations[:3], np.uint64), 32)
    after_first_copy = allocations()
    for count in (2, 3, 3):
        ops.copy(np.asarray(sources[:count], np.uint64), np.asarray(destinations[:count], np.uint64), 32)
    assert allocations() == after_first_copy

    # reserve sizes everything up front: no allocation at all in the steps it covers.
    device, ops, address = setup()
    sources = [device.allocate(32) for _ in range(6)]
    destinations = [device.allocate(32) for _ in range(6)]
    ops.reserve(8, vocab, max_eos=1, max_history_tokens=8 * 3, max_copies=6)
    reserved = allocations()
    for n in (8, 1, 5):
        step(n, history=3)
    ops.copy(np.asarray(sources, np.uint64), np.asarray(destinations, np.uint64), 32)
    assert allocations() == reserved
    ops.close()
    assert device.live_allocations() == 1 + 12  # the logits and the copies' rows: the ops hold nothing


# The Cython table, called through ctypes as the core calls it


ALLOCATE = CFUNCTYPE(c_void_p, c_void_p, c_size_t)
RELEASE = CFUNCTYPE(None, c_void_p, c_void_p)
COPY = CFUNCTYPE(c_int32, c_void_p, c_size_t, POINTER(c_void_p), POINTER(c_void_p), c_size_t, c_char_p, c_size_t)
FILL_ZERO = CFUNCTYPE(c_int32, c_void_p, c_void_p, c_size_t, c_char_p, c_size_t)
SYNCHRONIZE = CFUNCTYPE(c_int32, c_void_p, c_char_p, c_size_t)


class Sampling(Structure):
    _fields_ = [("num_rows", c_size_t), ("logits", c_void_p), ("logits_type", c_uint32),
                ("logits_row_stride", c_size_t), ("vocab_size", c_size_t), ("logits_rows", c_void_p),
                ("temperatures", c_void_p), ("top_ks", c_void_p), ("top_ps", c_void_p), ("seeds", c_void_p),
                ("counters", c_void_p), ("mask_eos", c_void_p), ("eos_ids", c_void_p), ("num_eos", c_size_t),
                ("repetition_penalties", c_void_p), ("history_offsets", c_void_p), ("history_tokens", c_void_p),
                ("tokens", c_void_p)]


SAMPLE = CFUNCTYPE(c_int32, c_void_p, POINTER(Sampling), c_char_p, c_size_t)
MEMORY_INFO = CFUNCTYPE(c_int32, c_void_p, POINTER(c_size_t), POINTER(c_size_t), c_char_p, c_size_t)


class DeviceOpsTable(Structure):
    """OgaExtDeviceOps (include/oga/oga_ext.h)."""
    _fields_ = [("context", c_void_p), ("allocate", ALLOCATE), ("release", RELEASE), ("copy", COPY),
                ("fill_zero", FILL_ZERO), ("synchronize", SYNCHRONIZE), ("read", COPY), ("sample", SAMPLE),
                ("memory_info", MEMORY_INFO)]


def table_of(ops):
    table = _core._device_ops_table(ops)
    return table, ctypes.cast(table.address, POINTER(DeviceOpsTable)).contents


def pointers(addresses):
    return (c_void_p * max(len(addresses), 1))(*addresses)


def test_the_cython_table_runs_every_operation(kernels):
    device = HostDevice(kernels)
    ops = DeviceOps(device, **SMALL_BLOCKS)
    owner, table = table_of(ops)
    assert owner.ops is ops
    message = ctypes.create_string_buffer(256)

    memory = [table.allocate(table.context, 48) for _ in range(6)]
    assert all(m and m % 64 == 0 for m in memory)
    rows = np.arange(3 * 48, dtype=np.uint8).reshape(3, 48)
    for i in range(3):
        ctypes.memmove(memory[i], rows[i].ctypes.data, 48)
    assert table.copy(table.context, 3, pointers(memory[:3]), pointers(memory[3:]), 48, message, 256) == 0
    assert table.fill_zero(table.context, memory[4], 8, message, 256) == 0
    assert table.synchronize(table.context, message, 256) == 0
    out = np.zeros((3, 48), dtype=np.uint8)
    destinations = [out[i].ctypes.data for i in range(3)]
    assert table.read(table.context, 3, pointers(memory[3:]), pointers(destinations), 48, message, 256) == 0
    want = rows.copy()
    want[1, :8] = 0
    np.testing.assert_array_equal(out, want)

    vocab = 40
    logits = np.random.default_rng(2).standard_normal((3, vocab)).astype(np.float32)
    logits[1, 5] = 9  # EOS 5 is row 1's best; batch row 0 masks it
    arrays = dict(logits_rows=np.asarray([1, 0, 2], np.int32), temperatures=np.zeros(3, np.float32),
                  top_ks=np.zeros(3, np.int32), top_ps=np.ones(3, np.float32), seeds=np.zeros(3, np.uint64),
                  counters=np.zeros(3, np.uint64), mask_eos=np.asarray([1, 0, 0], np.int32),
                  eos_ids=np.asarray([5], np.int32), repetition_penalties=np.ones(3, np.float32),
                  history_offsets=np.zeros(4, np.int64), history_tokens=np.zeros(1, np.int32),
                  tokens=np.full(3, -7, np.int32))
    sampling = Sampling(num_rows=3, logits=logits.ctypes.data, logits_type=0, logits_row_stride=vocab,
                        vocab_size=vocab, num_eos=1, **{k: v.ctypes.data for k, v in arrays.items()})
    assert table.sample(table.context, ctypes.byref(sampling), message, 256) == 0
    masked = logits[1].copy()
    masked[5] = -np.inf
    assert arrays["tokens"].tolist() == [int(np.argmax(masked)), int(np.argmax(logits[0])), int(np.argmax(logits[2]))]

    sampling.logits_type = 7
    assert table.sample(table.context, ctypes.byref(sampling), message, 256) != 0
    assert message.value == b"ValueError: unknown logits type 7"

    free, total = c_size_t(), c_size_t()
    assert table.memory_info(table.context, ctypes.byref(free), ctypes.byref(total), message, 256) == 0
    assert 0 < free.value <= total.value  # the host's available and physical memory

    for m in memory:
        table.release(table.context, m)
    ops.close()  # its own staging and scratch
    assert device.live_allocations() == 0


def test_the_cython_table_reports_failures():
    class Failing:
        samples_on_device = False

        def allocate(self, nbytes):
            raise RuntimeError("no memory today")

        def copy(self, sources, destinations, nbytes):
            raise ValueError(f"cannot copy {len(sources)} rows of {nbytes} bytes")

        def fill_zero(self, address, nbytes):
            raise OSError("fill")

        def synchronize(self):
            raise KeyError("sync")

        read = copy

        def memory_info(self):
            raise RuntimeError("cudaMemGetInfo failed")

    owner, table = table_of(Failing())
    message = ctypes.create_string_buffer(64)
    with pytest.warns(RuntimeWarning, match="a device allocation of 64 bytes failed: RuntimeError: no memory today"):
        assert table.allocate(table.context, 64) is None  # NULL: the core reports out of memory
    free, total = c_size_t(7), c_size_t(7)
    assert table.memory_info(table.context, ctypes.byref(free), ctypes.byref(total), message, 64) == 1
    assert message.value == b"RuntimeError: cudaMemGetInfo failed" and free.value == 7
    assert table.copy(table.context, 2, pointers([1, 2]), pointers([3, 4]), 8, message, 64) == 1
    assert message.value == b"ValueError: cannot copy 2 rows of 8 bytes"
    assert table.read(table.context, 1, pointers([1]), pointers([3]), 8, message, 64) == 1
    assert message.value == b"ValueError: cannot copy 1 rows of 8 bytes"
    assert table.fill_zero(table.context, 64, 8, message, 64) == 1
    assert message.value == b"OSError: fill"
    assert table.synchronize(table.context, message, 8) == 1
    assert message.value == b"KeyErro"  # truncated to the capacity, NUL-terminated
    # No device sampling: the table's sample is NULL.
    assert ctypes.cast(table.sample, c_void_p).value is None
    assert ctypes.cast(table_of(DeviceOps(HostDevice()))[1].sample, c_void_p).value is None


# The ONNX loader hands a decoder's device ops to the core


def test_the_onnx_loader_gives_the_core_the_decoders_device_ops(tmp_path, kernels, monkeypatch):
    """A hybrid decoder (fixed state) whose device_ops run on the host device: the engine keeps its
    fixed-state pool in memory from those ops, through the table _onnx_load built, and generates
    what it generates without them."""
    import oga as og
    from oga import executor as executors
    from oga.models import build
    from oga.models.random_weights import tiny_spec

    spec = tiny_spec(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2,
                     head_dim=8, context_length=128, layer_types=["conv", "attention", "recurrent"], conv_kernel=4)
    build(None, str(tmp_path), random_spec=spec, block_size=4, max_batch_size=4, max_scheduled_tokens=16, seed=5)

    def generate():
        engine = og.Engine(og.Model(str(tmp_path)))
        buffer = engine.create_event_buffer(16)
        requests, tokens = [], {}
        for prompt in ([3, 4, 5, 6, 7, 8], [9, 10], [11] * 5):
            request = engine.create_request()
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(6)
            request.begin_turn(np.asarray(prompt, np.int32), options)
            requests.append(request)
        while engine.has_pending_requests():
            for event in engine.run(buffer):
                assert not event.flags & og.EngineEventFlags.FAILED, event.error_code
                if event.flags & og.EngineEventFlags.TOKEN:
                    tokens.setdefault(requests.index(event.request), []).append(event.token)
        return tokens

    expected = generate()

    device = CountingHostDevice(kernels)
    loaded = []
    real_load = executors.load_decoder

    def load_with_device_ops(names, executor=None):
        decoder = real_load(names)  # the Python executor: it hands the core the decoder's device ops
        decoder.device_ops = DeviceOps(device, **SMALL_BLOCKS)
        loaded.append(decoder)
        return decoder

    monkeypatch.setattr(executors, "load_decoder", load_with_device_ops)
    launches = len(kernels.launches)
    assert generate() == expected
    (decoder,) = loaded
    assert decoder._device_ops_table.ops is decoder.device_ops
    assert device.allocations > 0  # the fixed-state banks and staging came from the ops
    assert any(name == "oga_gather_rows" for name, *_ in kernels.launches[launches:])  # batched copies
