"""numpy references for the kernels in cuda/, and the checks that hold a kernel's results to them.

The checks take a memory backend (host memory for the CPU emulator of tests/kernel_emulation.py,
device memory for tests/gpu) and a ``KernelLaunches`` (oga/cuda_kernels.py), so the CPU tests and
the device tests run the same cases through the same launchers.

Sampling tolerance: the reference works in float64 from the exact softmax weights. A kernel's token
passes when the reference picks it for some draw point within a relative ``SAMPLE_TOLERANCE`` of the
true one and some top_p target within the same relative distance of the true target (both relative
to the kept mass): the kernel's float32 exponentials (within 2 ulp) and its 2^-42 fixed-point
weights move both by far less. Everything else (greedy, top_k membership, ties, counters, the
processors on float32, the copies) must match exactly.
"""
import math

import numpy as np

SAMPLE_TOLERANCE = 1e-5
WEIGHT_UNIT = 2.0**-42

_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    """Random123's philox4x32_10, written from the spec (the host test checks cuda/philox.cuh against it
    and against Random123's known answers)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(10):
        if round_index:
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & _MASK32, p1 & _MASK32, ((p0 >> 32) ^ c3 ^ k1) & _MASK32, p0 & _MASK32
    return c0, c1, c2, c3


def philox_uniform(seed, n):
    """Draw n of stream `seed`: the 53-bit (out0 << 21) | (out1 >> 11), times 2^-53."""
    out = philox4x32_10((n & _MASK32, n >> 32, 0, 0), (seed & _MASK32, seed >> 32))
    return float((out[0] << 21) | (out[1] >> 11)) * (1.0 / 9007199254740992.0)


def order_keys(values):
    """The kernels' order-preserving uint32 keys of float32 values (-0 folded into +0)."""
    values = np.where(values == 0, np.float32(0), values).astype(np.float32)
    bits = values.view(np.uint32)
    return np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)


def reference_argmax(row):
    row = np.asarray(row, dtype=np.float32)
    candidates = row > -np.inf
    if not candidates.any():
        return -1
    return int(np.flatnonzero(row == row[candidates].max())[0])


def _sorted_candidates(row, candidates):
    """Candidate indices in (logit descending, index ascending) order."""
    indices = np.flatnonzero(candidates)
    keys = order_keys(row[indices]).astype(np.int64)
    return indices[np.lexsort((indices, -keys))]


def acceptable_samples(row, temperature, top_k, top_p, seed, counter):
    """(tokens a correct kernel may return, the token of the exact draw, the next counter)."""
    row = np.asarray(row, dtype=np.float32)
    vocab = row.size
    candidates = row > -np.inf
    if not candidates.any():
        return {-1}, -1, counter
    if not temperature > 0 or top_k == 1:
        token = reference_argmax(row)
        return {token}, token, counter
    order = _sorted_candidates(row, candidates)
    if 0 < top_k < vocab:
        order = order[:top_k]
    maximum = float(row[order[0]])
    logits = row[order].astype(np.float64)
    with np.errstate(invalid="ignore"):
        weights = np.where(logits == maximum, 1.0, np.exp((logits - maximum) / float(temperature)))
    kept_sets = [order]
    if 0.0 < top_p < 1.0:
        cumulative = np.cumsum(weights)
        total = cumulative[-1]
        target = float(np.float32(top_p)) * total
        low = int(np.searchsorted(cumulative, target - SAMPLE_TOLERANCE * total, side="left")) + 1
        high = int(np.searchsorted(cumulative, target + SAMPLE_TOLERANCE * total, side="left")) + 1
        exact = int(np.searchsorted(cumulative, target, side="left")) + 1
        kept_sets = [order[: min(exact, len(order))]]
        kept_sets += [order[: min(n, len(order))] for n in range(max(low, 1), min(high, len(order)) + 1)]
    u = philox_uniform(seed, counter)
    accepted = set()
    exact_token = None
    weight_of = np.zeros(vocab)
    weight_of[order] = weights
    for index, kept in enumerate(kept_sets):
        walk = np.sort(kept)  # the draw walks the kept candidates in index order
        cumulative = np.cumsum(weight_of[walk])
        mass = cumulative[-1]
        point = u * mass
        if index == 0:
            exact_token = int(walk[min(int(np.searchsorted(cumulative, point, side="right")), len(walk) - 1)])
        low = int(np.searchsorted(cumulative, point - SAMPLE_TOLERANCE * mass, side="right"))
        high = int(np.searchsorted(cumulative, point + SAMPLE_TOLERANCE * mass, side="right"))
        accepted.update(int(t) for t in walk[low : min(high, len(walk) - 1) + 1])
    return accepted, exact_token, counter + 1


def reference_mask_eos(logits, rows, generated, min_generated, eos_ids):
    out = logits.copy()
    vocab = logits.shape[1]
    for i, source in enumerate(rows):
        if generated[i] < min_generated[i]:
            for eos in eos_ids:
                if 0 <= eos < vocab:
                    out[source, eos] = -np.inf
    return out


def reference_repetition_penalty(logits, rows, penalties, offsets, tokens):
    """In float32, each distinct in-range token once; fp16 logits are computed in float32 and
    rounded back to nearest, as the kernel does."""
    out = logits.copy()
    vocab = logits.shape[1]
    for i, source in enumerate(rows):
        penalty = np.float32(penalties[i])
        if penalty == 1:
            continue
        for token in set(int(t) for t in tokens[offsets[i] : offsets[i + 1]]):
            if 0 <= token < vocab:
                value = np.float32(logits[source, token])
                out[source, token] = value / penalty if value > 0 else value * penalty
    return out


def reference_processed_row(logits, source, vocab, mask_eos, eos_ids, penalty, history):
    """Logits row `source` as a device sampler must see it (OgaExtDeviceSampling): the EOS ids at
    -inf when `mask_eos`, then the repetition penalty over `history`, in the logits' own type
    (float32, or fp16 rounded back to nearest, as the kernels store it); returned as float32."""
    block = logits[[source]].copy()
    block = reference_mask_eos(block, [0], [0], [int(mask_eos)], eos_ids)
    history = np.asarray(history, dtype=np.int32)
    block = reference_repetition_penalty(block, [0], [penalty], [0, len(history)], history)
    return block[0, :vocab].astype(np.float32)


# Checks: `mem` uploads and downloads arrays (put, get, empty, sync), `kernels` launches.


def check_device_ops_sample(ops, logits, vocab, logits_rows, temperatures, top_ks, top_ps, seeds, counters, mask_eos,
                            eos_ids, penalties, histories, *, address=None):
    """Runs oga.device_ops.DeviceOps.sample once, with the arrays its Cython trampoline passes (numpy
    arrays of the C types), over `logits` placed in the ops' device memory (or already at device
    `address`); checks every token against the reference (greedy rows exactly) and that the logits
    were not written. Returns the tokens."""
    device = ops.device
    placed = address is None
    if placed:
        address = device.allocate(logits.nbytes)
        device.upload(address, logits.ctypes.data, logits.nbytes)
    n = len(logits_rows)
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(h) for h in histories])
    history = np.concatenate([np.asarray(h, dtype=np.int32) for h in histories] + [np.zeros(0, np.int32)])
    tokens = np.full(n, -7, dtype=np.int32)
    temperatures = np.asarray(temperatures, np.float32)
    top_ks = np.asarray(top_ks, np.int32)
    top_ps = np.asarray(top_ps, np.float32)
    seeds = np.asarray(seeds, np.uint64)
    counters = np.asarray(counters, np.uint64)
    penalties = np.asarray(penalties, np.float32)
    try:
        ops.sample(n, address, 1 if logits.dtype == np.float16 else 0, logits.shape[1], vocab,
                   np.asarray(logits_rows, np.int32), temperatures, top_ks, top_ps, seeds, counters,
                   np.asarray(mask_eos, np.int32), np.asarray(eos_ids, np.int32), penalties, offsets, history, tokens)
        after = np.empty_like(logits)
        device.download(after.ctypes.data, address, after.nbytes)
        device.synchronize()
    finally:
        if placed:
            device.release(address)
    assert after.tobytes() == logits.tobytes(), "the executor's logits were written"
    for i in range(n):
        row = reference_processed_row(logits, logits_rows[i], vocab, mask_eos[i], eos_ids, penalties[i], histories[i])
        accepted, exact, _ = acceptable_samples(row, float(temperatures[i]), int(top_ks[i]), float(top_ps[i]),
                                                int(seeds[i]), int(counters[i]))
        assert int(tokens[i]) in accepted, (
            f"row {i}: token {tokens[i]}, reference {exact} (accepted {sorted(accepted)[:8]}), T={temperatures[i]} "
            f"top_k={top_ks[i]} top_p={top_ps[i]} mask_eos={mask_eos[i]} penalty={penalties[i]}")
        if not temperatures[i] > 0:
            assert int(tokens[i]) == exact, f"greedy row {i}: token {tokens[i]}, reference {exact}"
    return tokens


def _rows_map(mem, logits_rows):
    if logits_rows is None:
        return 0
    return mem.put(np.asarray(logits_rows, dtype=np.int32)).ptr


def check_argmax(mem, kernels, logits, *, logits_rows=None, block=1024):
    """logits: [rows, stride] float32 or float16; compares every batch row's token."""
    num_rows = logits.shape[0] if logits_rows is None else len(logits_rows)
    rows = list(range(num_rows)) if logits_rows is None else list(logits_rows)
    vocab = logits.shape[1]
    device_logits = mem.put(logits)
    tokens = mem.empty(num_rows, np.int32)
    kernels.argmax(device_logits.ptr, logits.shape[1], vocab, num_rows, tokens.ptr, dtype=logits.dtype,
                   logits_rows=_rows_map(mem, logits_rows), block=block)
    mem.sync()
    got = mem.get(tokens)
    want = [reference_argmax(logits[r].astype(np.float32)) for r in rows]
    assert got.tolist() == want


def check_sample(mem, kernels, logits, temperatures, top_ks, top_ps, seeds, counters, *, vocab=None,
                 logits_rows=None, block=1024):
    """Runs the sampler once over every row; returns (tokens, exact-draw agreement count)."""
    num_rows = logits.shape[0] if logits_rows is None else len(logits_rows)
    rows = list(range(num_rows)) if logits_rows is None else list(logits_rows)
    vocab = logits.shape[1] if vocab is None else vocab
    device_logits = mem.put(logits)
    tokens = mem.empty(num_rows, np.int32)
    next_counters = mem.empty(num_rows, np.uint64)
    temperatures = np.asarray(temperatures, dtype=np.float32)
    top_ks = np.asarray(top_ks, dtype=np.int32)
    top_ps = np.asarray(top_ps, dtype=np.float32)
    seeds = np.asarray(seeds, dtype=np.uint64)
    counters = np.asarray(counters, dtype=np.uint64)
    kernels.sample(device_logits.ptr, logits.shape[1], vocab, num_rows, mem.put(temperatures).ptr,
                   mem.put(top_ks).ptr, mem.put(top_ps).ptr, mem.put(seeds).ptr, mem.put(counters).ptr, tokens.ptr,
                   next_counters.ptr, dtype=logits.dtype, logits_rows=_rows_map(mem, logits_rows), block=block)
    mem.sync()
    got = mem.get(tokens)
    got_counters = mem.get(next_counters)
    exact = 0
    for i, source in enumerate(rows):
        accepted, exact_token, next_counter = acceptable_samples(
            logits[source, :vocab].astype(np.float32), float(temperatures[i]), int(top_ks[i]), float(top_ps[i]),
            int(seeds[i]), int(counters[i]))
        assert int(got[i]) in accepted, (
            f"row {i}: token {got[i]}, reference {exact_token} (accepted {sorted(accepted)[:8]}), "
            f"T={temperatures[i]} top_k={top_ks[i]} top_p={top_ps[i]} seed={seeds[i]} counter={counters[i]}")
        assert int(got_counters[i]) == next_counter, f"row {i}: next counter {got_counters[i]}, want {next_counter}"
        exact += int(got[i]) == exact_token
    return got, exact


def check_mask_eos(mem, kernels, logits, generated, min_generated, eos_ids, *, logits_rows=None):
    num_rows = len(generated)
    rows = list(range(num_rows)) if logits_rows is None else list(logits_rows)
    device_logits = mem.put(logits)
    eos = np.asarray(eos_ids, dtype=np.int32)
    kernels.mask_eos(device_logits.ptr, logits.shape[1], logits.shape[1], num_rows,
                     mem.put(np.asarray(generated, dtype=np.int32)).ptr,
                     mem.put(np.asarray(min_generated, dtype=np.int32)).ptr, mem.put(eos).ptr, len(eos),
                     dtype=logits.dtype, logits_rows=_rows_map(mem, logits_rows))
    mem.sync()
    want = reference_mask_eos(logits, rows, generated, min_generated, eos_ids)
    np.testing.assert_array_equal(mem.get(device_logits), want)


def check_repetition_penalty(mem, kernels, logits, penalties, histories, *, logits_rows=None, block=256):
    num_rows = len(histories)
    rows = list(range(num_rows)) if logits_rows is None else list(logits_rows)
    offsets = np.zeros(num_rows + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(h) for h in histories])
    tokens = np.concatenate([np.asarray(h, dtype=np.int32) for h in histories] + [np.zeros(1, np.int32)])
    device_logits = mem.put(logits)
    penalties = np.asarray(penalties, dtype=np.float32)
    kernels.repetition_penalty(device_logits.ptr, logits.shape[1], logits.shape[1], num_rows, mem.put(penalties).ptr,
                               mem.put(offsets).ptr, mem.put(tokens).ptr, dtype=logits.dtype,
                               logits_rows=_rows_map(mem, logits_rows), block=block)
    mem.sync()
    want = reference_repetition_penalty(logits, rows, penalties, offsets, tokens)
    np.testing.assert_array_equal(mem.get(device_logits), want)


def check_copies(mem, kernels, rng, *, row_bytes, num_rows, num_slots):
    """Gather, scatter and block copy over len(row_bytes) buffers of num_slots rows each."""
    sources = [rng.integers(0, 256, size=(num_slots, b), dtype=np.uint8) for b in row_bytes]
    device_sources = [mem.put(s) for s in sources]
    max_bytes = max(row_bytes)
    sizes = mem.put(np.asarray(row_bytes, dtype=np.uint64))

    def bases(buffers):
        return mem.put(np.asarray([b.ptr for b in buffers], dtype=np.uint64)).ptr

    # Gather (with zero rows), into contiguous rows.
    rows = rng.integers(-1, num_slots, size=num_rows).astype(np.int32)
    gathered = [mem.put(np.full((num_rows, b), 0x5A, dtype=np.uint8)) for b in row_bytes]
    kernels.gather_rows(bases(device_sources), bases(gathered), sizes.ptr, len(row_bytes), mem.put(rows).ptr,
                        num_rows, max_row_bytes=max_bytes)
    mem.sync()
    for source, out in zip(sources, gathered):
        want = np.where((rows >= 0)[:, None], source[np.maximum(rows, 0)], 0).astype(np.uint8)
        np.testing.assert_array_equal(mem.get(out), want)

    # Scatter contiguous rows to distinct slots (padding rows skipped).
    slots = rng.permutation(num_slots)[:num_rows].astype(np.int32)
    slots[rng.random(num_rows) < 0.2] = -1
    staged = [rng.integers(0, 256, size=(num_rows, b), dtype=np.uint8) for b in row_bytes]
    banks = [rng.integers(0, 256, size=(num_slots, b), dtype=np.uint8) for b in row_bytes]
    device_banks = [mem.put(b) for b in banks]
    kernels.scatter_rows(bases([mem.put(s) for s in staged]), bases(device_banks), sizes.ptr, len(row_bytes),
                         mem.put(slots).ptr, num_rows, max_row_bytes=max_bytes)
    mem.sync()
    for bank, stage, out in zip(banks, staged, device_banks):
        want = bank.copy()
        for i, slot in enumerate(slots):
            if slot >= 0:
                want[slot] = stage[i]
        np.testing.assert_array_equal(mem.get(out), want)

    # Block copies within each buffer (sources and destinations disjoint), and across two buffers
    # (bank normalization: the same slot from one bank into the other).
    permutation = rng.permutation(num_slots)
    count = min(num_rows, num_slots // 2)
    pairs = np.stack([permutation[:count], permutation[count : 2 * count]], axis=1).astype(np.int32)
    blocks = [rng.integers(0, 256, size=(num_slots, b), dtype=np.uint8) for b in row_bytes]
    device_blocks = [mem.put(b) for b in blocks]
    kernels.copy_blocks(bases(device_blocks), bases(device_blocks), sizes.ptr, len(row_bytes),
                        mem.put(pairs.reshape(-1)).ptr, count, max_block_bytes=max_bytes)
    mem.sync()
    for block, out in zip(blocks, device_blocks):
        want = block.copy()
        want[pairs[:, 1]] = block[pairs[:, 0]]
        np.testing.assert_array_equal(mem.get(out), want)
    other = [mem.put(np.zeros((num_slots, b), dtype=np.uint8)) for b in row_bytes]
    same = np.repeat(pairs[:, :1], 2, axis=1).astype(np.int32)
    kernels.copy_blocks(bases(device_blocks), bases(other), sizes.ptr, len(row_bytes), mem.put(same.reshape(-1)).ptr,
                        count, max_block_bytes=max_bytes)
    mem.sync()
    for source, out in zip(device_blocks, other):
        got, source_now = mem.get(out), mem.get(source)
        want = np.zeros_like(source_now)
        want[same[:, 0]] = source_now[same[:, 0]]
        np.testing.assert_array_equal(got, want)


def sampling_cases(rng, vocab, rows, dtype=np.float32):
    """Logits and per-row parameters that cover the selection rules: plain temperature, top_k alone,
    top_p alone, both, greedy by temperature 0 and by top_k 1, ties at the top_k threshold, -inf and
    NaN logits, a row with one candidate, a row with none, top_k at or above the vocabulary."""
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    temperatures = rng.choice([0.5, 0.8, 1.0, 1.7], size=rows).astype(np.float32)
    top_ks = rng.choice([0, 0, 1, 2, 5, 17, vocab, vocab + 3], size=rows).astype(np.int32)
    top_ps = rng.choice([1.0, 1.0, 0.3, 0.9, 0.999, 0.0], size=rows).astype(np.float32)
    for r in range(rows):
        kind = r % 8
        if kind == 1:  # ties around the top_k threshold: few distinct values
            logits[r] = rng.integers(0, 4, size=vocab).astype(np.float32)
            top_ks[r] = max(2, vocab // 3)
        elif kind == 2:  # masked tokens
            logits[r, rng.random(vocab) < 0.3] = -np.inf
            logits[r, rng.random(vocab) < 0.05] = np.nan
        elif kind == 3:  # one candidate left
            logits[r] = -np.inf
            logits[r, rng.integers(vocab)] = 1.0
        elif kind == 4:  # a peaked row: top_p keeps a handful
            logits[r, rng.integers(vocab, size=3)] += 12
            top_ps[r] = 0.9
        elif kind == 5:  # greedy by temperature 0
            temperatures[r] = 0.0
        elif kind == 6 and r % 16 == 6:  # no candidate at all
            logits[r] = -np.inf
        elif kind == 7 and vocab >= 4:  # -0 and +0 tie at the top: top_k 2 keeps indices 1 and 2
            logits[r] = -1.0
            logits[r, 1] = -0.0
            logits[r, 2:4] = 0.0
            top_ks[r] = 2
    if dtype == np.float16:
        logits = logits.astype(np.float16)
    return logits, temperatures, top_ks, top_ps


def check_sampling_cases(mem, kernels, rng, *, vocab, rows, draws, dtype=np.float32, block=1024):
    """Several draws (counters) over sampling_cases; returns the fraction of rows whose token equals
    the exact-arithmetic draw (expected to be 1 in all but boundary cases)."""
    logits, temperatures, top_ks, top_ps = sampling_cases(rng, vocab, rows, dtype)
    seeds = rng.integers(0, 2**64, size=rows, dtype=np.uint64)
    exact = 0
    for draw in range(draws):
        counters = np.full(rows, draw, dtype=np.uint64) + np.arange(rows, dtype=np.uint64) * 1000
        _, agree = check_sample(mem, kernels, logits, temperatures, top_ks, top_ps, seeds, counters, block=block)
        exact += agree
    return exact / (rows * draws)


def log_weight_mass(row, temperature):
    """Softmax weights of a float32 row in float64 (for distribution checks)."""
    row = np.asarray(row, dtype=np.float64)
    finite = row > -np.inf
    w = np.zeros_like(row)
    w[finite] = np.exp((row[finite] - row[finite].max()) / temperature)
    return w / w.sum()


def check_sample_distribution(tokens, row, temperature, top_k, top_p):
    """Tokens drawn from one row follow the softmax over its kept candidates (top_k highest, then
    the smallest prefix reaching top_p): none outside them, and a chi-square fit inside."""
    row = np.asarray(row, dtype=np.float32)
    vocab = row.size
    order = np.lexsort((np.arange(vocab), -row))
    kept = order[:top_k] if top_k else order
    weights = np.exp((row[kept].astype(np.float64) - row.max()) / temperature)
    if top_p < 1:
        cut = int(np.searchsorted(np.cumsum(weights), top_p * weights.sum())) + 1
        kept, weights = kept[:cut], weights[:cut]
    probabilities = np.zeros(vocab)
    probabilities[kept] = weights / weights.sum()
    counts = np.bincount(np.asarray(tokens), minlength=vocab)
    assert counts[probabilities == 0].sum() == 0
    assert chi_square_ok(counts, probabilities, len(tokens))


def chi_square_ok(counts, probabilities, draws):
    """A loose chi-square goodness-of-fit check (p > 1e-4) without scipy."""
    expected = probabilities * draws
    keep = expected > 5
    statistic = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    dof = max(int(keep.sum()) - 1, 1)
    # Wilson-Hilferty: chi2/dof approximately normal.
    z = ((statistic / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return z < 3.72


def device_array(device, array):
    """`array` copied into a fresh allocation of an oga.device device; returns its address."""
    array = np.ascontiguousarray(array)
    address = device.allocate(array.nbytes)
    device.upload(address, array.ctypes.data, array.nbytes)
    device.synchronize()
    return address


def device_read(device, address, shape, dtype):
    """`shape` elements of `dtype` at device `address`, copied to the host."""
    out = np.empty(shape, dtype=dtype)
    device.download(out.ctypes.data, address, out.nbytes)
    device.synchronize()
    return out
