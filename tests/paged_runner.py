"""PagedRunner: a built paged decoder run step by step through ONNX Runtime the way an engine runs
it (packed rows, scattered block tables, caches bound as past and present), and ReferenceRows: the
numpy reference fed the same chunks. Shared by the graph builder tests."""
import numpy as np
import onnxruntime as ort

from oga import ortops
from oga.models.reference import Reference

BLOCK = 4
NUM_BLOCKS = 40


class PagedRunner:
    """Runs a built CPU graph step by step the way an engine does: packed rows, a block table,
    caches bound as both past and present (one numpy buffer each, NaN-filled to start so a read
    of a slot no row wrote poisons the logits). Each row's table also holds `reserve_ahead`
    blocks beyond what it needs (never written: NaN), as an engine's reservations do."""

    def __init__(self, model, spec, block_size=BLOCK, num_blocks=NUM_BLOCKS, seed=0, reserve_ahead=1,
                 cache_dtype=np.float32):
        self.spec, self.block_size, self.reserve_ahead = spec, block_size, reserve_ahead
        options = ort.SessionOptions()
        ortops.register(options)                       # the fused graphs' operators
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.caches = {(i, kind): np.full(shape, np.nan, cache_dtype)
                       for i in range(spec.num_layers) for kind in ("key", "value")}
        self.free = list(np.random.default_rng(seed).permutation(num_blocks))   # scattered block ids
        self.blocks: dict[str, list[int]] = {}
        self.length: dict[str, int] = {}

    def step(self, rows, logits_indices=None):
        """rows: [(sequence name, new tokens)]; returns the graph's logits."""
        ids, cu, past, tables = [], [0], [], []
        for name, tokens in rows:
            start = self.length.get(name, 0)
            table = self.blocks.setdefault(name, [])
            while len(table) * self.block_size < start + len(tokens) + self.reserve_ahead * self.block_size:
                table.append(int(self.free.pop()))
            ids += list(tokens)
            cu.append(cu[-1] + len(tokens))
            past.append(start)
            tables.append(table)
            self.length[name] = start + len(tokens)
        width = max(len(t) for t in tables)
        block_table = np.full((len(rows), width), -1, np.int32)
        for r, table in enumerate(tables):
            block_table[r, :len(table)] = table
        q = [len(t) for _, t in rows]
        io = self.session.io_binding()
        io.bind_cpu_input("input_ids", np.asarray(ids, np.int64))
        io.bind_cpu_input("cumulative_sequence_lengths", np.asarray(cu, np.int32))
        io.bind_cpu_input("past_sequence_lengths", np.asarray(past, np.int32))
        io.bind_cpu_input("block_table", block_table)
        kv = max(p + n for p, n in zip(past, q))
        io.bind_cpu_input("attention_metadata", np.asarray([max(q), kv, kv], np.int32))
        if logits_indices is not None:
            io.bind_cpu_input("logits_indices", np.asarray(logits_indices, np.int32))
        io.bind_output("logits")
        self.bound = {}
        for (i, kind), arr in self.caches.items():
            value = ort.OrtValue.ortvalue_from_numpy(arr)
            io.bind_ortvalue_input(f"past_key_values.{i}.{kind}", value)
            io.bind_ortvalue_output(f"present.{i}.{kind}", value)
            self.bound[(i, kind)] = value
        self.session.run_with_iobinding(io)
        outputs = io.get_outputs()
        for (i, kind), arr in self.caches.items():      # ORT wrote the present into the bound buffer
            assert outputs[1 + 2 * i + (kind == "value")].data_ptr() == arr.ctypes.data
        return outputs[0].numpy()

    def slot(self, name, position):
        return self.blocks[name][position // self.block_size], position % self.block_size


class ReferenceRows:
    """Per-sequence numpy references fed the same chunks, giving every token's logits."""

    def __init__(self, loaded):
        self.loaded, self.refs, self.logits = loaded, {}, {}

    def step(self, rows):
        for name, tokens in rows:
            ref = self.refs.setdefault(name, Reference(self.loaded))
            self.logits.setdefault(name, []).append(ref.step(tokens))
        return [self.logits[name][-1] for name, _ in rows]
