"""The static batching path: a static-batching decoder's per-engine state (OGA's CPU builds:
GroupQueryAttention over contiguous caches, no engine.dynamic_batching)."""
import ctypes
import time

import numpy as np

from .contract import LOGITS_FLOAT16, LOGITS_FLOAT32, STATUS_OK, classify_failure
from .host import OnnxEngineExecutor


def _int64_rows(address, rows, columns):
    """The core's [rows, columns] int64 buffer at `address`, as a numpy view (no copy)."""
    return np.ctypeslib.as_array((ctypes.c_int64 * (rows * columns)).from_address(address)).reshape(rows, columns)


class StaticOnnxEngineExecutor:
    """Per-engine state of the static path: per-layer caches [max_batch_size, kv_heads, max_length,
    head_size] allocated once and zeroed, bound as both past and present (GroupQueryAttention then
    updates them in place); a step uses the leading `batch_size` rows, which are contiguous.

    Fixed decoder state (LFM2's conv layers, `past.%d.conv` / `present.%d.conv`): two banks per
    tensor of [max_batch_size, *row] allocated once; a step reads one and writes the other, and the
    two swap when it succeeds (a failed step leaves the committed state as it was; ONNX Runtime
    gives no guarantee that an op may write its state in place). A new batch's prefill reads zeros.

    Rows alone (decoder.static_rows_alone): a padded prefill would run the padding through the
    convolution and leave it in a shorter row's state (0.18 does, and its shorter rows continue from
    that state), and ONNX Runtime's windowed GroupQueryAttention (sliding_window_cache) refuses a
    right-padded prefill (0.18 fails such a batch). With fixed state or sliding-window layers, a new
    batch's prefill whose rows differ in length runs every row alone, over its own tokens."""

    live = OnnxEngineExecutor.live

    def __init__(self, decoder, geometry):
        OnnxEngineExecutor.live.add(self)
        self.decoder = decoder
        self.session = decoder.session
        self.binding = self.session.io_binding()
        self.names = n = decoder.names
        self.vocab = n["vocab_size"]
        heads, head_size = decoder.cache_geometry
        rows, length = geometry["max_batch_size"], geometry["max_sequence_length"]
        self.caches = [(name, present, np.zeros((rows, heads, length, head_size), dtype=decoder.cache_dtype))
                       for pasts, presents in ((n["past_key_names"], n["present_key_names"]),
                                               (n["past_value_names"], n["present_value_names"]))
                       for name, present in zip(pasts, presents)]
        # Per fixed tensor: (input name, output name, [committed bank, bank the next step writes]).
        self.fixed = [(t.input_name, t.output_name, [np.zeros((rows, *t.row_shape), dtype=t.dtype) for _ in range(2)])
                      for t in decoder.fixed_states]
        self.position_ids = n["position_ids"] if decoder.has_position_ids else None
        # Logits of every query position of a step (grown on demand: a prefill needs rows x prompt x
        # vocab), and the one row per request the engine reads.
        self.step_logits = np.empty(0, dtype=decoder.logits_dtype)
        self.logits = np.zeros((rows, self.vocab), dtype=decoder.logits_dtype)
        self.logits_type = LOGITS_FLOAT16 if decoder.logits_dtype == np.float16 else LOGITS_FLOAT32
        self.session_run_ns = 0
        self._bound_rows = None   # (first row, row count) the KV caches are bound for

    def close(self):
        """Called when the engine closes (close_engine): host memory goes with this object."""

    def _bind_rows(self, first, count):
        """The KV caches' rows [first, first + count), as past and present (one buffer: in place),
        and the fixed state banks' same rows."""
        if self._bound_rows != (first, count):
            for past, present, cache in self.caches:
                view = cache[first:first + count]
                self.binding.bind_input(past, "cpu", 0, cache.dtype, view.shape, view.ctypes.data)
                self.binding.bind_output(present, "cpu", 0, cache.dtype, view.shape, view.ctypes.data)
            self._bound_rows = (first, count)
        for past, present, (committed, written) in self.fixed:
            for name, bank, bind in ((past, committed, self.binding.bind_input),
                                     (present, written, self.binding.bind_output)):
                view = bank[first:first + count]
                bind(name, "cpu", 0, bank.dtype, view.shape, view.ctypes.data)

    def _run(self, first, count, ids, mask, positions):
        """One session run over rows [first, first + count): ids, mask and positions are [count, *]
        arrays whose memory outlives the run. Returns the step logits [count, query, vocab] or raises."""
        n = self.names
        self._bind_rows(first, count)
        query = ids.shape[1]
        self.binding.bind_input(n["input_ids"], "cpu", 0, np.int64, ids.shape, ids.ctypes.data)
        self.binding.bind_input(n["attention_mask"], "cpu", 0, np.int64, mask.shape, mask.ctypes.data)
        if self.position_ids is not None:
            self.binding.bind_input(self.position_ids, "cpu", 0, np.int64, positions.shape, positions.ctypes.data)
        needed = count * query * self.vocab
        if self.step_logits.size < needed:
            self.step_logits = np.empty(needed, dtype=self.logits.dtype)
        step_logits = self.step_logits[:needed].reshape(count, query, self.vocab)
        self.binding.bind_output(n["logits"], "cpu", 0, step_logits.dtype, step_logits.shape, step_logits.ctypes.data)
        start = time.perf_counter_ns()
        try:
            self.session.run_with_iobinding(self.binding)
        finally:
            self.session_run_ns += time.perf_counter_ns() - start
        return step_logits

    def execute_static(self, batch_size, sequence_length, total_length, input_ids, attention_mask, positions,
                       position_ids, new_batch):
        wanted = np.ctypeslib.as_array((ctypes.c_int32 * batch_size).from_address(positions))
        ids = _int64_rows(input_ids, batch_size, sequence_length)
        mask = _int64_rows(attention_mask, batch_size, total_length)
        position_rows = _int64_rows(position_ids, batch_size, sequence_length)
        if new_batch:
            for _, _, (committed, _) in self.fixed:
                committed[:batch_size] = 0
        alone = self.decoder.static_rows_alone and new_batch and bool((wanted != sequence_length - 1).any())
        try:
            if alone:
                # Prefill rows of different lengths with fixed state: each row over its own tokens (a
                # new batch's mask is ones up to the row's length, so its first columns are its own).
                for r in range(batch_size):
                    fed = int(wanted[r]) + 1
                    step_logits = self._run(r, 1, ids[r:r + 1, :fed], mask[r:r + 1, :fed], position_rows[r:r + 1, :fed])
                    self.logits[r] = step_logits[0, fed - 1]
            else:
                step_logits = self._run(0, batch_size, ids, mask, position_rows)
                self.logits[:batch_size] = step_logits[np.arange(batch_size), wanted]
        except Exception as error:
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        for _, _, banks in self.fixed:
            banks.reverse()   # the state just written is now the committed one
        return STATUS_OK, "", self.logits.ctypes.data, batch_size
