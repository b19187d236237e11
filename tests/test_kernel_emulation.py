"""The kernels of cuda/ themselves, run on the CPU emulator (tests/kernel_emulator.h), against the
numpy references of tests/kernel_reference.py, through the launchers of oga/cuda_kernels.py. Small
blocks and vocabularies keep it fast; several warps per block and vocabularies that do not divide
into them exercise every path of the block-wide algorithms. tests/gpu runs the same checks on a
device at full size."""
import numpy as np
import pytest

import kernel_reference as ref
from kernel_emulation import EmulatedKernels, HostMemory, build_emulated_kernels


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    return EmulatedKernels(build_emulated_kernels(str(tmp_path_factory.mktemp("emulated_kernels"))))


@pytest.fixture
def mem():
    return HostMemory()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block", [32, 96, 256])
def test_argmax(kernels, mem, dtype, block):
    rng = np.random.default_rng(block)
    logits = rng.integers(-3, 3, size=(9, 517)).astype(dtype)  # many ties: the lowest index must win
    logits[1] = -np.inf
    logits[2] = np.nan
    logits[3, :200] = np.nan
    logits[4, 516] = 100
    logits[5, :] = -np.inf
    logits[5, 300] = -1e30 if dtype == np.float32 else -60000
    ref.check_argmax(mem, kernels, logits, block=block)
    ref.check_argmax(mem, kernels, logits, block=block, logits_rows=[8, 0, 2, 2, 5])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("vocab,block", [(1, 32), (7, 64), (40, 32), (300, 96), (2051, 128)])
def test_sampling_follows_the_reference(kernels, dtype, vocab, block):
    rng = np.random.default_rng(vocab * 7 + block)
    agreement = ref.check_sampling_cases(HostMemory(), kernels, rng, vocab=vocab, rows=24, draws=3, dtype=dtype,
                                         block=block)
    assert agreement > 0.95  # the rest differ only within the tolerance of a boundary


def test_sampling_reads_rows_through_the_row_map_and_a_stride(kernels, mem):
    rng = np.random.default_rng(11)
    logits = rng.standard_normal((5, 80)).astype(np.float32)
    vocab = 70  # the stride (80) is wider than the vocabulary: columns 70..79 are never read
    logits[:, 70:] = 1e9
    rows = [3, 3, 0, 4, 1]
    ref.check_sample(mem, kernels, logits, [1.0, 0.7, 1.3, 0.0, 2.0], [0, 10, 3, 0, 50], [1.0, 0.8, 1.0, 1.0, 0.95],
                     [1, 2, 3, 4, 5], [0, 9, 2**40, 7, 3], vocab=vocab, logits_rows=rows, block=64)


def test_a_draw_is_a_function_of_seed_and_counter(kernels, mem):
    """Restoring a step's counters replays its draws; counter + 1 is the next, different draw."""
    rng = np.random.default_rng(5)
    logits = np.repeat(rng.standard_normal((1, 500)).astype(np.float32), 64, axis=0)
    params = ([1.0] * 64, [0] * 64, [1.0] * 64, [99] * 64)
    counters = np.arange(64, dtype=np.uint64) * 3
    first, _ = ref.check_sample(mem, kernels, logits, *params, counters, block=64)
    again, _ = ref.check_sample(mem, kernels, logits, *params, counters, block=64)
    later, _ = ref.check_sample(mem, kernels, logits, *params, counters + 1, block=64)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, later)


@pytest.mark.parametrize("top_k,top_p,temperature", [(0, 1.0, 1.0), (6, 1.0, 0.7), (0, 0.8, 1.3), (5, 0.9, 1.0)])
def test_sampling_distribution(kernels, mem, top_k, top_p, temperature):
    """Many draws of one row (one batch row per counter) follow the kept softmax."""
    rng = np.random.default_rng(top_k + 17)
    vocab, draws = 24, 3000
    row = (rng.standard_normal(vocab) * 1.5).astype(np.float32)
    logits = row[None, :]
    tokens, _ = ref.check_sample(mem, kernels, logits, [temperature] * draws, [top_k] * draws, [top_p] * draws,
                                 [2024] * draws, np.arange(draws), logits_rows=[0] * draws, block=32)
    ref.check_sample_distribution(tokens, row, temperature, top_k, top_p)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_mask_eos(kernels, mem, dtype):
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((6, 100)) * 4).astype(dtype)
    # Rows below their minimum get every in-range EOS id masked; ids outside the vocabulary are ignored.
    ref.check_mask_eos(mem, kernels, logits, [0, 5, 3, 9], [2, 5, 4, 0], [1, 7, 99, 150, -3],
                       logits_rows=[5, 1, 0, 3])
    ref.check_mask_eos(mem, kernels, logits, [0] * 6, [1] * 6, [0])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("block", [32, 256])
def test_repetition_penalty(kernels, mem, dtype, block):
    rng = np.random.default_rng(block)
    logits = (rng.standard_normal((6, 300)) * 4).astype(dtype)
    histories = [rng.integers(-2, 310, size=n) for n in (0, 1, 50, 700)]  # repeats and out-of-range ids
    ref.check_repetition_penalty(mem, kernels, logits, [1.3, 1.0, 0.7, 2.0], histories, logits_rows=[4, 2, 0, 1],
                                 block=block)
    ref.check_repetition_penalty(mem, kernels, logits, [1.3, 1.5, 0.7, 2.0], histories, block=block)


def test_repetition_penalty_reserves_a_bitmap_of_the_vocabulary(kernels, mem):
    logits = np.ones((1, 1000), dtype=np.float32)
    ref.check_repetition_penalty(mem, kernels, logits, [2.0], [[999, 999, 0, 31, 32]], block=32)
    assert kernels.launches[-1] == ("oga_repetition_penalty_f32", (1, 1, 1), (32, 1, 1), 4 * 32)


@pytest.mark.parametrize("row_bytes", [[16, 48, 4096], [3, 5, 7], [8, 24], [4, 12, 1000], [20000]])
def test_copies(kernels, mem, row_bytes):
    ref.check_copies(mem, kernels, np.random.default_rng(len(row_bytes)), row_bytes=row_bytes, num_rows=6,
                     num_slots=13)


def test_copies_loop_when_the_grid_is_smaller_than_the_work(kernels, mem, monkeypatch):
    """The kernels loop over rows (y) and buffers (z) beyond the grid, so the 65535 limit of those
    grid dimensions is none; several blocks (x) share a row."""
    monkeypatch.setattr(kernels, "_copy_grid", lambda max_bytes, items, num_buffers: (3, 2, 2))
    ref.check_copies(mem, kernels, np.random.default_rng(9), row_bytes=[64, 40, 7, 160], num_rows=7, num_slots=15)


def test_launchers_check_their_arguments(kernels):
    with pytest.raises(ValueError, match="float32 or float16"):
        kernels.argmax(0, 10, 10, 1, 0, dtype="bfloat16")
    with pytest.raises(ValueError, match="multiple of 32"):
        kernels.sample(0, 10, 10, 1, 0, 0, 0, 0, 0, 0, 0, block=48)
    with pytest.raises(ValueError, match="num_rows must be 0 or more"):
        kernels.argmax(0, 10, 10, -1, 0)
    count = len(kernels.launches)
    kernels.argmax(0, 10, 10, 0, 0)  # nothing to do: no launch
    kernels.gather_rows(0, 0, 0, 3, 0, 0, max_row_bytes=16)
    assert len(kernels.launches) == count


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 10, 1.0), (1.5, 0, 0.8), (1.0, 20, 0.65), (2.0, 5, 0.8), (3.0, 0, 0.3), (0.5, 50, 1.0)])
def test_the_engines_cpu_sampler_is_the_kernels_reference(kernels, temperature, top_k, top_p):
    """The core's CPU sampler (through the engine and the test model, whose logits the test
    oracle knows) and the device sampling kernel (emulated) take the same Philox draw of the same
    seed and pick the same token: both walk the kept candidates in index order. Each is also checked
    against the numpy reference (within its rounding tolerance)."""
    import oga as og
    import oga.testing as ogt
    from helpers import OracleSequence, logits as oracle_logits

    vocab, prompt = 64, [5, 9, 13]
    seq = OracleSequence(vocab)
    seq.extend(prompt)
    row = oracle_logits(seq.state, vocab)
    engine = og.Engine(ogt.create_test_model(vocab_size=vocab, max_batch_size=32, num_blocks=512))
    buffer = engine.create_event_buffer(64)
    seeds = list(range(1000, 1032))
    requests = {}
    for seed in seeds:
        request = engine.create_request()
        options = og.TurnOptions(request)
        for name, value in (("do_sample", True), ("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                            ("seed", seed), ("max_generated_tokens", 1), ("min_generated_tokens", 1)):
            getattr(options, "set_" + name)(value)
        request.begin_turn(prompt, options)
        requests[id(request)] = (seed, request)
    cpu = {}
    while engine.has_pending_requests():
        for event in engine.run(buffer):
            if event.flags & og.EngineEventFlags.TOKEN:
                cpu[requests[id(event.request)][0]] = event.token
    # min_generated_tokens masks EOS for the CPU; the kernel sees the same masked row
    masked = row.copy()
    masked[1] = -np.inf
    mem = HostMemory()
    logits = np.tile(masked, (len(seeds), 1))
    device, _ = ref.check_sample(mem, kernels, logits, [temperature] * len(seeds), [top_k] * len(seeds),
                                 [top_p] * len(seeds), seeds, [0] * len(seeds), block=32)
    agree = 0
    for i, seed in enumerate(seeds):
        accepted, exact, _ = ref.acceptable_samples(masked, temperature, top_k, top_p, seed, 0)
        assert cpu[seed] in accepted, (seed, cpu[seed], exact)
        agree += cpu[seed] == int(device[i])
    assert agree >= len(seeds) - 1  # only a draw within rounding of a boundary may differ
    assert len(set(cpu.values())) > 1  # the draws went different ways
