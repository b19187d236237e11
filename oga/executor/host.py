"""The host path: a paged decoder's per-engine state when its session runs on the CPU provider.

The core hands every step over as packed buffers it owns (OgaExtStepInputs in
include/oga/oga_ext.h). They are bound to the session by address through IOBinding, so nothing is
copied on the way in; the KV caches are allocated once per engine, zeroed, and bound as both the
cache input and the cache output of every layer, so ONNX Runtime updates them in place (the graph
must produce each present cache straight out of ScatterND). The logits land in a buffer allocated
once at the configured row limit. A buffer whose address and shape did not change since the previous
step is not bound again.

Sliding-window ring layers: when the graph takes `block_table_windowed`, the layers named by
model.decoder.sliding_window keep their KV in a ring; their caches are
[window_blocks, block_size, kv_heads, head_size] (window_blocks from the engine geometry), bound
the same way, and every step binds the engine's windowed block table next to the full one.

Fixed decoder state: execute takes `fixed_state`, one (input address, output address) pair per
fixed tensor -- (input, output, capture) triples when the decoder captures per-token state --, each
[num_rows, *row_shape] contiguous memory of the engine's, and binds them by address.

This is the Python executor (OGA_EXECUTOR=python): the _core.pyx trampolines call its methods at
engine creation, at every step and at engine close, taking the GIL each time. The native executor
(oga/executor/native.py) does the same in C++ without it.
"""
import time
import weakref

import numpy as np

from .contract import (CAPTURE_SUFFIX, LOGITS_BLOCK, LOGITS_FLOAT16, LOGITS_FLOAT32, STATUS_FATAL, STATUS_OK,
                       classify_failure)

class OnnxEngineExecutor:
    """Per-engine state: caches, the IOBinding and the logits buffer, all allocated once. The host
    path: caches and logits in host memory, the engine's packed buffers bound where they are."""

    # Every open executor, for tests and diagnostics (the engine owns them; this does not).
    live = weakref.WeakSet()
    # ONNX Runtime's (device type, device id) of the memory bound to the session.
    ort_device = ("cpu", 0)
    # OgaExtStepOutputs.logits_on_device: the host path's logits are host memory.
    logits_on_device = 0
    # OgaExtStepOutputs.logits_block_maxima: the address of the block maxima buffer (0: none), and
    # its row stride in floats.
    block_maxima_address = 0
    block_maxima_stride = 0

    def __init__(self, decoder, geometry):
        n = decoder.names
        self.windowed = decoder.windowed_block_table
        if self.windowed and not (geometry.get("window_blocks") and geometry.get("window_ring_blocks")):
            raise RuntimeError(
                f"{decoder.path}: the decoder keeps its sliding-window layers {sorted(decoder.ring_layers)} in a ring "
                f"of blocks ('{n['block_table_windowed']}'), but the engine allocated no window blocks "
                f"(window_blocks {geometry.get('window_blocks', 0)}, window_ring_blocks "
                f"{geometry.get('window_ring_blocks', 0)}); the ring needs dynamic batching with "
                "search.chunk_size > 0.")
        OnnxEngineExecutor.live.add(self)
        self.decoder = decoder
        self.session = decoder.session
        self.binding = self.session.io_binding()
        # (address, shape) bound to each name, so an input whose buffer and shape did not change
        # since the previous step is not rebound.
        self._bound = {}
        self.vocab = n["vocab_size"]
        self.names = n
        # the decoder's FixedStateTensor list (empty without fixed state); execute binds them
        self.fixed_states = decoder.fixed_states
        # whether execute also binds each fixed tensor's per-token capture (draft verification)
        self.fixed_state_capture = decoder.fixed_state_capture
        # Wall time inside session.run, so benchmarks can separate engine overhead from the model.
        self.session_run_ns = 0
        shape = (geometry["num_blocks"],) + tuple(decoder.cache_geometry)
        ring_shape = (geometry.get("window_blocks", 0),) + tuple(decoder.cache_geometry)
        self.caches = []
        # {(layer id, "key" | "value"): cache}: every paged layer's cache (the same objects as
        # self.caches: arrays here, device addresses on the device path); a sliding-window ring
        # layer's holds window_blocks blocks
        self.layer_caches = {}
        for layer, past_k, past_v, present_k, present_v in zip(
                n["paged_layer_ids"], n["past_key_names"], n["past_value_names"], n["present_key_names"],
                n["present_value_names"]):
            ring = layer in decoder.ring_layers
            for kind, past, present in (("key", past_k, present_k), ("value", past_v, present_v)):
                cache_shape = ring_shape if ring else shape
                cache, address = self._new_cache(cache_shape, decoder.cache_dtype)
                self.layer_caches[(layer, kind)] = cache
                self.caches.append(cache)
                self._bind_input(past, decoder.cache_dtype, cache_shape, address)
                self._bind_output(present, decoder.cache_dtype, cache_shape, address)
        rows = geometry["max_scheduled_tokens"] if decoder.per_token_logits else geometry["max_batch_size"]
        self._new_logits(rows, decoder.logits_dtype)
        self.logits_type = LOGITS_FLOAT16 if decoder.logits_dtype == np.float16 else LOGITS_FLOAT32
        self._new_block_maxima(rows)

    def _new_block_maxima(self, rows):
        """The graph's block maxima output (decoder.block_maxima), bound beside the logits."""
        self.block_maxima = None
        if self.decoder.block_maxima:
            self.block_maxima = np.zeros((rows, -(-self.vocab // LOGITS_BLOCK)), dtype=np.float32)
            self.block_maxima_address = self.block_maxima.ctypes.data
            self.block_maxima_stride = self.block_maxima.shape[1]

    def _new_cache(self, shape, dtype):
        """A zeroed cache: (the object kept in self.caches, its address)."""
        cache = np.zeros(shape, dtype=dtype)
        return cache, cache.ctypes.data

    def _new_logits(self, rows, dtype):
        self.logits = np.zeros((rows, self.vocab), dtype=dtype)

    def close(self):
        """Called when the engine closes (close_engine): host memory goes with this object."""

    def _bind_input(self, name, dtype, shape, address, device=None):
        key = (address, shape)
        if self._bound.get(name) != key:
            device_type, device_id = device or self.ort_device
            self.binding.bind_input(name, device_type, device_id, dtype, shape, address)
            self._bound[name] = key

    def _bind_output(self, name, dtype, shape, address):
        key = ("output", address, shape)
        if self._bound.get(name) != key:
            device_type, device_id = self.ort_device
            self.binding.bind_output(name, device_type, device_id, dtype, shape, address)
            self._bound[name] = key

    def _bind_fixed_state(self, num_rows, num_tokens, fixed_state):
        """Binds each fixed tensor's (input, output[, capture]) addresses for `num_rows` rows and
        `num_tokens` packed tokens; returns an error message or ""."""
        tensors = self.decoder.fixed_states
        if not tensors:
            if fixed_state:
                return "the step passes fixed_state, but the decoder has no fixed state tensors"
            return ""
        capture = self.decoder.fixed_state_capture
        what = "(input, output, capture) address triples" if capture else "(input, output) address pairs"
        if fixed_state is None or len(fixed_state) != len(tensors):
            return (f"the decoder has {len(tensors)} fixed state tensors "
                    f"({', '.join(t.input_name for t in tensors)}), but the step passes "
                    f"{0 if fixed_state is None else len(fixed_state)} {what}")
        for tensor, entry in zip(tensors, fixed_state):
            try:
                addresses = tuple(int(a) for a in entry)
            except (TypeError, ValueError):
                addresses = ()
            if len(addresses) not in (2, 3):
                return (f"fixed state '{tensor.input_name}': expected an (input address, output address) pair "
                        "or an (input, output, capture) triple")
            source, target = addresses[:2]
            snapshot = addresses[2] if len(addresses) == 3 else 0
            if not source or not target:
                return f"fixed state '{tensor.input_name}': a null address"
            if capture and not snapshot:
                return (f"fixed state '{tensor.input_name}': the decoder writes every packed token's state to "
                        f"'{tensor.capture_name}', but the step passes no capture address")
            if snapshot and not capture:
                return (f"fixed state '{tensor.input_name}': the step passes a capture address, but the decoder "
                        f"has no per-token state output ('{tensor.output_name}{CAPTURE_SUFFIX}')")
            size = num_rows * tensor.row_bytes
            if source < target + size and target < source + size:
                return (f"fixed state '{tensor.input_name}': the output '{tensor.output_name}' overlaps the input "
                        "(a step must not write over the state it reads)")
            if capture:
                captured = num_tokens * tensor.row_bytes
                for name, address in ((tensor.input_name, source), (tensor.output_name, target)):
                    # the input is still being read while captures are written, and two outputs
                    # sharing memory would leave either one's rows undefined
                    if snapshot < address + size and address < snapshot + captured:
                        return (f"fixed state '{tensor.input_name}': the capture '{tensor.capture_name}' overlaps "
                                f"'{name}'")
            # The engine owns this memory (on the executor's device through OgaExtDeviceOps when
            # the session runs on one): bound where it is, with the device's ONNX Runtime type.
            shape = (num_rows,) + tensor.row_shape
            self._bind_input(tensor.input_name, tensor.dtype, shape, source)
            self._bind_output(tensor.output_name, tensor.dtype, shape, target)
            if capture:
                # one row per packed token: rebound whenever the address or the token count changes
                self._bind_output(tensor.capture_name, tensor.dtype, (num_tokens,) + tensor.row_shape, snapshot)
        return ""

    def execute(self, step):
        """Binds this step's packed buffers (`step`, an oga._core.StepInputs: addresses owned by the
        engine) and runs the session. `step.fixed_state`: for a decoder with fixed state tensors, one
        (input address, output address)
        pair per entry of decoder.fixed_states, in that order, each [num_rows, *row_shape]
        contiguous memory of the tensor's dtype, row r being packed row r; the input and output
        must not overlap. When decoder.fixed_state_capture, each entry is an (input, output,
        capture) triple instead, the capture [num_tokens, *row_shape] memory (row t = the state
        after packed token t) overlapping neither; otherwise a third address, if given, must be 0.
        `graph_id` (OgaExtStepInputs.graph_id) is always -1 here: the host path does not declare
        cuda_graph. Returns (status, message, logits address, rows)."""
        n = self.names
        bind = self._bind_input
        num_rows, num_tokens, columns = step.num_rows, step.num_tokens, step.block_table_columns
        error = self._bind_fixed_state(num_rows, num_tokens, step.fixed_state)
        if error:
            return STATUS_FATAL, error, 0, 0
        bind(n["input_ids"], np.int64, (num_tokens,), step.input_ids)
        bind(n["cumulative_sequence_lengths"], np.int32, (num_rows + 1,), step.cumulative_sequence_lengths)
        bind(n["past_sequence_lengths"], np.int32, (num_rows,), step.past_sequence_lengths)
        bind(n["block_table"], np.int32, (num_rows, columns), step.block_table)
        if self.windowed:
            if not step.block_table_windowed:
                return STATUS_FATAL, (f"the decoder keeps sliding-window layers in a ring, but the step has no "
                                      f"'{n['block_table_windowed']}'"), 0, 0
            bind(n["block_table_windowed"], np.int32, (num_rows, columns), step.block_table_windowed)
        if self.decoder.has_position_ids:
            bind(n["position_ids"], np.int64, (num_tokens,), step.position_ids)
        if self.decoder.has_attention_metadata:
            bind(n["attention_metadata"], np.int32, (3,), step.attention_metadata)
        if self.decoder.has_logits_indices:
            bind(n["logits_indices"], np.int32, (num_rows,), step.logits_indices)
        rows = num_tokens if self.decoder.per_token_logits else num_rows
        self._bind_output(n["logits"], self.logits.dtype, (rows, self.vocab), self.logits.ctypes.data)
        if self.block_maxima is not None:
            self._bind_output(self.decoder.block_maxima, np.float32, (rows, self.block_maxima.shape[1]),
                              self.block_maxima_address)
        start = time.perf_counter_ns()
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as error:  # ONNX Runtime raises its own exception types
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        finally:
            self.session_run_ns += time.perf_counter_ns() - start
        return STATUS_OK, "", self.logits.ctypes.data, rows
