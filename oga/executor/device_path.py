"""The device path: a paged decoder's per-engine state when its session runs on a device (CUDA, or
the CPU test double oga.device.HostDevice).

Paged and ring caches are allocated on the device once and zero-filled, and bound as past and
present as on the host path; one device buffer holds every packed input at its configured limit,
filled each step from one pinned staging buffer with at most one upload per input, and bound at
addresses that never change (so a captured CUDA graph can replay over them); the logits land in a
device buffer at the row limit and are handed to the engine as device logits
(OgaExtStepOutputs.logits_on_device): the decoder's device_ops select tokens there with the sampling
kernels and read back only the rows the engine selects on the host (without device ops the
executor copies the rows back itself). With cuda_graph every step runs with the run option
gpu_graph_id = OgaExtStepInputs.graph_id (-1: eager). Fixed state stays engine-owned, in device
memory the core allocates and copies through the device ops; its addresses are bound with the
device's ONNX Runtime device type. Device out-of-memory at open_engine is a capacity failure
(MemoryError); ONNX Runtime's CUDA out-of-memory texts during a run are classified as capacity too.
"""
import ctypes
import time

import numpy as np

from ..device import ALIGNMENT
from .contract import STATUS_FATAL, STATUS_OK, classify_failure
from .host import OnnxEngineExecutor

# Bytes of unused capacity between two staged inputs that one upload may carry along instead of
# starting a second copy: a copy call costs roughly what moving 64 KiB over PCIe does.
UPLOAD_MERGE_GAP = 64 * 1024


def _aligned(size):
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class DeviceOnnxEngineExecutor(OnnxEngineExecutor):
    """The device path (a session on CUDAExecutionProvider, or the CPU test path with HostDevice):
    caches, packed inputs and logits in memory of `decoder.device`, allocated once here and never
    moved, so a captured CUDA graph can replay over them.

    Every step packs the engine's host arrays into one host staging buffer (pinned on CUDA) laid out
    like the device input buffer, each input at a fixed offset sized for its configured limit, and
    uploads the used part with at most one copy per input (neighbours merged into one copy when the
    capacity between them is small). Inputs are bound as views of the device buffer, rebound only
    when a shape changes. attention_metadata stays in the staging buffer and is bound as CPU memory:
    PagedAttention's CUDA kernel declares it a CPU input (seed: "a CPU int32[3] attention metadata
    input"), and a graph reads it only while it is captured. The logits land in a device buffer at
    the row limit; see `logits_on_device` for how they reach the engine."""

    def __init__(self, decoder, geometry):
        self.device = decoder.device
        self.ort_device = (self.device.ort_device_type, int(self.device.device_id))
        self._allocations = []  # device addresses this executor owns, released by close()
        self.cuda_graph = decoder.cuda_graph
        self._run_options = {}  # graph id -> RunOptions carrying gpu_graph_id
        self._graphs_seen = set()  # graph ids that ran once (eagerly, see _run_options_for)
        # OgaExtStepOutputs.logits_on_device. 1 (the decoder hands the core its DeviceOps): execute
        # returns the device address and copies nothing; the engine samples on the device and reads
        # back only the rows it selects on the host. 0: each step's logits rows are copied back into
        # a pinned host buffer with one device-to-host copy.
        self.logits_on_device = 1 if decoder.device_ops is not None else 0
        try:
            super().__init__(decoder, geometry)
            self._allocate_inputs(decoder, geometry)
            if decoder.device_ops is not None:
                # The sampler's staging and scratch at the step limits, so no step allocates.
                rows = geometry["max_batch_size"]
                decoder.device_ops.reserve(rows, self.vocab, row_stride=self.vocab,
                                           logits_itemsize=self.logits.itemsize, max_copies=rows)
            self.device.synchronize()  # the caches' zero fill is complete before the first run
        except BaseException:
            self.close()
            raise

    def _allocate(self, nbytes):
        address = self.device.allocate(nbytes)
        self._allocations.append(address)
        return address

    def _new_cache(self, shape, dtype):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        address = self._allocate(nbytes)
        self.device.fill_zero(address, nbytes)
        return address, address

    def _new_logits(self, rows, dtype):
        nbytes = rows * self.vocab * np.dtype(dtype).itemsize
        self.device_logits = self._allocate(nbytes)
        if self.logits_on_device:
            # Never written: the engine reads the device logits through the DeviceOps. An untouched
            # np.empty (no pages committed) keeps the row limit and dtype; pinned memory here would
            # lock rows x vocab x itemsize of host memory for nothing (max_scheduled_tokens rows on a
            # per-token-logits decoder).
            self.logits = np.empty((rows, self.vocab), dtype=dtype)
        else:
            # where a step's logits rows are copied back to (pinned on CUDA)
            self.logits = self.device.host_buffer(nbytes).view(dtype).reshape(rows, self.vocab)

    def _new_block_maxima(self, rows):
        """Not bound here: OgaExtStepOutputs.logits_block_maxima is host memory beside host logits, and
        the greedy pass it saves is the device sampler's (or a row read back) on this path; ONNX Runtime
        keeps a graph's maxima output to itself."""
        self.block_maxima = None

    def _allocate_inputs(self, decoder, geometry):
        """The device input buffer and the staging buffer: every packed input at its limit."""
        n = self.names
        rows, tokens = geometry["max_batch_size"], geometry["max_scheduled_tokens"]
        table = rows * geometry["max_block_table_columns"]
        # (graph input name, dtype, elements at the limit); the fixed-size row arrays first, the
        # block tables last, so a step's used bytes sit mostly at the front of the buffer.
        inputs = [(n["cumulative_sequence_lengths"], np.int32, rows + 1), (n["past_sequence_lengths"], np.int32, rows)]
        if decoder.has_logits_indices:
            inputs.append((n["logits_indices"], np.int32, rows))
        inputs.append((n["input_ids"], np.int64, tokens))
        if decoder.has_position_ids:
            inputs.append((n["position_ids"], np.int64, tokens))
        inputs.append((n["block_table"], np.int32, table))
        if self.windowed:
            inputs.append((n["block_table_windowed"], np.int32, table))
        # name -> (offset, dtype, limit) in both buffers
        self.input_slots = {}
        offset = 0
        for name, dtype, limit in inputs:
            self.input_slots[name] = (offset, dtype, limit)
            offset = _aligned(offset + limit * np.dtype(dtype).itemsize)
        self.device_inputs = self._allocate(offset)
        self.device_inputs_bytes = offset
        self._metadata_offset = offset  # host only, past the uploaded region
        self.staging = self.device.host_buffer(offset + _aligned(3 * 4))
        self._staging_address = self.staging.ctypes.data

    def close(self):
        """Releases the device memory (at engine close, or when open_engine fails); idempotent."""
        allocations, self._allocations = self._allocations, []
        for address in allocations:
            self.device.release(address)
        self.caches = []
        self.layer_caches = {}

    def _stage(self, name, source, count):
        """Copies `count` elements of the engine's array at `source` into the input's staging slot;
        returns the slot's used byte range (the same offsets in the device buffer)."""
        offset, dtype, limit = self.input_slots[name]
        if count > limit:
            raise ValueError(f"the step has {count} elements of '{name}', above the {limit} the executor "
                             "allocated at open_engine")
        nbytes = count * np.dtype(dtype).itemsize
        ctypes.memmove(self._staging_address + offset, source, nbytes)
        return offset, offset + nbytes

    def _upload(self, ranges):
        """One host-to-device copy per used range, neighbours closer than UPLOAD_MERGE_GAP merged."""
        merged = []
        for start, end in sorted(r for r in ranges if r[1] > r[0]):
            if merged and start - merged[-1][1] <= UPLOAD_MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in merged:
            self.device.upload(self.device_inputs + start, self._staging_address + start, end - start)

    def _run_options_for(self, graph_id):
        """RunOptions with gpu_graph_id (-1: eager) when the executor declares cuda_graph, else None."""
        if not self.cuda_graph:
            return None
        if graph_id >= 0 and graph_id not in self._graphs_seen:
            # A graph id's first step runs eagerly. ONNX Runtime's CUDA provider captures after a
            # count of ordinary runs that (in some versions) is kept per thread rather than per graph,
            # so it may capture a new graph on its first run; a capture that has to grow the memory
            # arena fails. The eager run leaves the arena holding that shape's activations.
            self._graphs_seen.add(graph_id)
            graph_id = -1
        options = self._run_options.get(graph_id)
        if options is None:
            import onnxruntime as ort

            options = ort.RunOptions()
            options.add_run_config_entry("gpu_graph_id", str(int(graph_id)))
            self._run_options[graph_id] = options
        return options

    def execute(self, step):
        """As OnnxEngineExecutor.execute; `step.graph_id` (OgaExtStepInputs.graph_id) becomes the run
        option gpu_graph_id when the executor declares cuda_graph. The returned logits address is
        host memory unless `logits_on_device`."""
        n = self.names
        num_rows, num_tokens, columns, graph_id = step.num_rows, step.num_tokens, step.block_table_columns, step.graph_id
        error = self._bind_fixed_state(num_rows, num_tokens, step.fixed_state)
        if error:
            return STATUS_FATAL, error, 0, 0
        if self.windowed and not step.block_table_windowed:
            return STATUS_FATAL, (f"the decoder keeps sliding-window layers in a ring, but the step has no "
                                  f"'{n['block_table_windowed']}'"), 0, 0
        if graph_id >= 0 and not self.cuda_graph:
            return STATUS_FATAL, (f"the step asks for CUDA graph {graph_id}, but the executor declares no "
                                  "cuda_graph"), 0, 0
        try:
            inputs = [(n["input_ids"], step.input_ids, num_tokens, (num_tokens,)),
                      (n["cumulative_sequence_lengths"], step.cumulative_sequence_lengths, num_rows + 1, (num_rows + 1,)),
                      (n["past_sequence_lengths"], step.past_sequence_lengths, num_rows, (num_rows,)),
                      (n["block_table"], step.block_table, num_rows * columns, (num_rows, columns))]
            if self.windowed:
                inputs.append((n["block_table_windowed"], step.block_table_windowed, num_rows * columns,
                               (num_rows, columns)))
            if self.decoder.has_position_ids:
                inputs.append((n["position_ids"], step.position_ids, num_tokens, (num_tokens,)))
            if self.decoder.has_logits_indices:
                inputs.append((n["logits_indices"], step.logits_indices, num_rows, (num_rows,)))
            ranges = []
            for name, source, count, shape in inputs:
                ranges.append(self._stage(name, source, count))
                offset, dtype, _ = self.input_slots[name]
                self._bind_input(name, dtype, shape, self.device_inputs + offset)
            self._upload(ranges)
            if self.decoder.has_attention_metadata:
                metadata = self._staging_address + self._metadata_offset
                ctypes.memmove(metadata, step.attention_metadata, 3 * 4)
                self._bind_input(n["attention_metadata"], np.int32, (3,), metadata, device=("cpu", 0))
            rows = num_tokens if self.decoder.per_token_logits else num_rows
            if rows > self.logits.shape[0]:
                raise ValueError(f"the step needs {rows} logits rows, above the {self.logits.shape[0]} allocated")
            self._bind_output(n["logits"], self.logits.dtype, (rows, self.vocab), self.device_logits)
            run_options = self._run_options_for(graph_id)
        except Exception as error:
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        # The uploads run on the session's stream, so they are ordered before the run's kernels. The
        # next step refills the staging buffer only after this step's stream work is complete: the
        # synchronize after the logits copy below (with logits on the device, the engine's read /
        # sample, complete on return, on the same stream; after a failed run, the synchronize there).
        start = time.perf_counter_ns()
        try:
            if run_options is None:
                self.session.run_with_iobinding(self.binding)
            else:
                self.session.run_with_iobinding(self.binding, run_options)
        except Exception as error:  # ONNX Runtime raises its own exception types
            status, text = classify_failure(error), f"{type(error).__name__}: {error}"
            try:
                self.device.synchronize()
            except Exception as sync_error:
                text += f" (then synchronizing the device failed: {type(sync_error).__name__}: {sync_error})"
                status = STATUS_FATAL
            return status, text, 0, 0
        finally:
            self.session_run_ns += time.perf_counter_ns() - start
        if self.logits_on_device:
            return STATUS_OK, "", self.device_logits, rows
        try:
            self.device.download(self.logits.ctypes.data, self.device_logits, rows * self.vocab * self.logits.itemsize)
            self.device.synchronize()
        except Exception as error:
            return classify_failure(error), f"{type(error).__name__}: {error}", 0, 0
        return STATUS_OK, "", self.logits.ctypes.data, rows
