"""The static batching path: a static-batching decoder's per-engine state (OGA's CPU builds:
GroupQueryAttention over contiguous caches, no engine.dynamic_batching)."""
import ctypes
import time

import numpy as np

from .contract import LOGITS_FLOAT16, LOGITS_FLOAT32, STATUS_OK, classify_failure
from .host import OnnxEngineExecutor

class StaticOnnxEngineExecutor:
    """Per-engine state of the static path: per-layer caches [max_batch_size, kv_heads, max_length,
    head_size] allocated once and zeroed, bound as both past and present (GroupQueryAttention then
    updates them in place); a step uses the leading `batch_size` rows, which are contiguous."""

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
        # Logits of every query position of a step (grown on demand: a prefill needs rows x prompt x
        # vocab), and the one row per request the engine reads.
        self.step_logits = np.empty(0, dtype=decoder.logits_dtype)
        self.logits = np.zeros((rows, self.vocab), dtype=decoder.logits_dtype)
        self.logits_type = LOGITS_FLOAT16 if decoder.logits_dtype == np.float16 else LOGITS_FLOAT32
        self.session_run_ns = 0
        self._bound_rows = None

    def close(self):
        """Called when the engine closes (close_engine): host memory goes with this object."""

    def execute_static(self, batch_size, sequence_length, total_length, input_ids, attention_mask, positions):
        n = self.names
        if self._bound_rows != batch_size:
            for past, present, cache in self.caches:
                view = cache[:batch_size]
                self.binding.bind_input(past, "cpu", 0, cache.dtype, view.shape, view.ctypes.data)
                self.binding.bind_output(present, "cpu", 0, cache.dtype, view.shape, view.ctypes.data)
            self._bound_rows = batch_size
        self.binding.bind_input(n["input_ids"], "cpu", 0, np.int64, (batch_size, sequence_length), input_ids)
        self.binding.bind_input(n["attention_mask"], "cpu", 0, np.int64, (batch_size, total_length), attention_mask)
        needed = batch_size * sequence_length * self.vocab
        if self.step_logits.size < needed:
            self.step_logits = np.empty(needed, dtype=self.logits.dtype)
        step_logits = self.step_logits[:needed].reshape(batch_size, sequence_length, self.vocab)
        self.binding.bind_output(n["logits"], "cpu", 0, step_logits.dtype, step_logits.shape, step_logits.ctypes.data)
        start = time.perf_counter_ns()
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as error:
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        finally:
            self.session_run_ns += time.perf_counter_ns() - start
        wanted = np.ctypeslib.as_array((ctypes.c_int32 * batch_size).from_address(positions))
        self.logits[:batch_size] = step_logits[np.arange(batch_size), wanted]
        return STATUS_OK, "", self.logits.ctypes.data, batch_size
