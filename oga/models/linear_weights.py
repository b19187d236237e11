"""Linear layers of the CPU graphs at a chosen precision: which form each weight takes, and the nodes
that compute x @ W^T with it.

Precision (`oga build --precision`):
- None ("auto", the default): a GGUF source keeps its own quantization wherever MatMulNBits holds it
  exactly (Q4_0, Q4_1 -> 4 bits, Q8_0 -> 8 bits, repacked block for block); every other tensor (F32,
  F16, BF16, K-quants, ...) and every non-GGUF source stays fp32.
- "int4" / "int8": blocks already at that width are repacked exactly; everything else is quantized
  round-to-nearest (blocks of 32, per-block scale and uint8 zero point) from its float weights.
- "fp32": float weights everywhere (GGUF blocks dequantized).
The tied embedding / LM head is 8-bit in int4 and int8 builds (exact from Q8_0, round-to-nearest
otherwise): it is a fifth of SmolLM2's weights and reads once per step, and 4 bits there costs more
accuracy than it saves. A weight whose in_features is not a multiple of 32 stays fp32.

Forms and their nodes:
- float: Gemm(x, W, transB=1) (ONNX Runtime prepacks W).
- MatMulNBits (Q4_0, Q8_0, round-to-nearest): one com.microsoft.MatMulNBits.
- MatMulNBits with block offsets (Q4_1: w = d q + m, see quantize.py): MatMulNBits computes d q and
  the offsets add y += blocksums(x) @ C^T, blocksums(x)[r, b] summing x[r] over block b. The fused
  graph hands (x, C^T) to the oga operator that consumes y (SkipRMSNorm, SwiGlu,
  PagedGroupQueryAttention), which adds them on the fly; elsewhere they are standard nodes
  (Reshape, ReduceSum, MatMul, Add).
- oga.QuantizedLinear (the fused graph at accuracy_level 4, emit_oga_linear): MatMulNBits' inputs and
  the block offsets in one oga operator (ortops/quantized_linear.h), which quantizes activations to
  int8 per block of 32 as accuracy_level 4 does, and gives each row the same bits in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import quantize as qz

CHOSEN_PRECISIONS = ("int4", "int8", "fp32")    # what --precision names (None: the source's own)
PRECISIONS = (None,) + CHOSEN_PRECISIONS
DEFAULT_ACCURACY_LEVEL = 4      # MatMulNBits on CPU: int8 activations (ONNX Runtime's fastest kernels)
MS_DOMAIN = "com.microsoft"
OGA_DOMAIN = "oga"
# The accuracy level oga.QuantizedLinear computes at (int8 activations per block of 32); the fused
# graph keeps MatMulNBits for the others.
OGA_LINEAR_ACCURACY_LEVEL = 4


def check_precision(precision):
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of int4, int8, fp32 (or None for the source's own), got {precision!r}")


def check_accuracy_level(level):
    if level not in (0, 1, 2, 3, 4):
        raise ValueError(f"accuracy_level must be 0..4 (MatMulNBits), got {level!r}")


@dataclass
class Linear:
    """One weight [n, k] in the form the graph uses: `quantized` (MatMulNBits) or `weight` (float)."""

    name: str
    n: int
    k: int
    weight: np.ndarray | None = None          # float32 [n, k]
    quantized: qz.BlockQuantized | None = None

    def effective(self) -> np.ndarray:
        """The float32 weight the graph computes with (dequantized when quantized)."""
        return self.quantized.dequantize() if self.quantized is not None else self.weight

    @property
    def kind(self) -> str:
        return "fp32" if self.quantized is None else f"int{self.quantized.bits}"


def choose(name: str, weight: np.ndarray, blocks: dict, precision, bits_override: int | None = None) -> Linear:
    """The form of weight `name` (float32 [n, k], HF layout) at `precision`; `blocks` holds the
    source's exact block-quantized tensors by name. `bits_override` forces the width of a quantized
    build (the LM head: 8)."""
    n, k = weight.shape
    exact = blocks.get(name)
    if precision == "fp32" or k % qz.BLOCK_SIZE:
        return Linear(name, n, k, weight=weight)
    if precision is None:
        return Linear(name, n, k, quantized=exact) if exact is not None else Linear(name, n, k, weight=weight)
    bits = bits_override or (4 if precision == "int4" else 8)
    if exact is not None and exact.bits == bits:
        return Linear(name, n, k, quantized=exact)
    return Linear(name, n, k, quantized=qz.quantize(weight, bits))


def fuse(name: str, parts: list[Linear]) -> list[Linear]:
    """The parts stacked along n into one Linear when they share a form (fp32, or MatMulNBits of one
    width); else the parts unchanged."""
    kinds = {p.kind for p in parts}
    if len(kinds) != 1:
        return parts
    n = sum(p.n for p in parts)
    if parts[0].quantized is None:
        return [Linear(name, n, parts[0].k, weight=np.concatenate([p.weight for p in parts], axis=0))]
    return [Linear(name, n, parts[0].k, quantized=qz.concat_rows([p.quantized for p in parts]))]


def emit_matmul(g, x: str, linear: Linear, accuracy_level: int, hint: str, output: str | None = None):
    """The MatMul part of x @ W^T: (y, offsets) where offsets is None, or, for a weight with block
    offsets, the [offset_input, offset_weights] inputs an oga operator consuming y adds them from
    (C^T as float16 [k/32, n]; emit() adds them with standard nodes instead)."""
    outputs = [output] if output else None
    if linear.quantized is None:
        w = g.initializer(linear.name, np.ascontiguousarray(linear.weight, dtype=np.float32))
        return g.op("Gemm", [x, w], hint, outputs=outputs, transB=1), None
    q = linear.quantized
    inputs = [x, g.initializer(linear.name + ".codes", q.packed_codes()),
              g.initializer(linear.name + ".scales", q.flat_scales())]
    zero_points = q.packed_zero_points()
    if zero_points is not None:
        inputs.append(g.initializer(linear.name + ".zero_points", zero_points))
    y = g.op("MatMulNBits", inputs, hint, outputs=outputs, domain=MS_DOMAIN, K=q.k, N=q.n, bits=q.bits,
             block_size=q.block_size, accuracy_level=int(accuracy_level))
    if q.offsets is None:
        return y, None
    offsets = np.ascontiguousarray(q.offsets.T)                                   # [blocks, n]
    half = offsets.astype(np.float16)
    if not np.array_equal(half.astype(np.float32), offsets):
        raise ValueError(f"{linear.name}: block offsets not exact in float16")     # GGUF offsets are fp16
    return y, [x, g.initializer(linear.name + ".block_offsets", half)]


def emit_oga_linear(g, x: str, linear: Linear, hint: str, output: str | None = None, *, skip: str | None = None,
                    gamma: str | None = None, epsilon: float = 1e-5, want_sum: bool = False, swiglu: bool = False):
    """x @ W^T of a quantized `linear` as one oga.QuantizedLinear (offsets included); returns y. With
    `gamma` the node first takes RMSNorm(x (+ skip)) * gamma (and with `want_sum` returns (y, x + skip)
    too); with `swiglu` x is gate|up and the node first takes SiLU(gate) * up."""
    q = linear.quantized
    inputs = [x, g.initializer(linear.name + ".codes", q.packed_codes()),
              g.initializer(linear.name + ".scales", q.flat_scales()), "", "", skip or "", gamma or ""]
    zero_points = q.packed_zero_points()
    if zero_points is not None:
        inputs[3] = g.initializer(linear.name + ".zero_points", zero_points)
    if q.offsets is not None:
        offsets = np.ascontiguousarray(q.offsets.T)                               # [blocks, n]
        half = offsets.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), offsets):
            raise ValueError(f"{linear.name}: block offsets not exact in float16")  # GGUF offsets are fp16
        inputs[4] = g.initializer(linear.name + ".block_offsets", half)
    while inputs[-1] == "":
        inputs.pop()
    attributes = dict(K=q.k, N=q.n, bits=q.bits, block_size=q.block_size)
    if gamma is not None:
        attributes["epsilon"] = float(epsilon)
    if swiglu:
        attributes["activation"] = 1
    base = g._unique(hint)
    outputs = [output or f"{base}/output"] + ([f"{base}/sum"] if want_sum else [])
    return g.op("QuantizedLinear", inputs, hint, outputs=outputs, domain=OGA_DOMAIN, **attributes)


def emit(g, x: str, linear: Linear, accuracy_level: int, hint: str, bias: str | None = None,
         output: str | None = None) -> str:
    """Nodes computing x @ W^T (+ bias) for `linear` in standard and contrib ops (block offsets as
    Reshape, ReduceSum, MatMul, Add); returns the output name (`output` if given)."""
    plain = bias is None and (linear.quantized is None or linear.quantized.offsets is None)
    y, offsets = emit_matmul(g, x, linear, accuracy_level, hint, output=output if plain else None)
    if offsets is not None:
        q = linear.quantized
        sums = g.op("ReduceSum", [g.reshape(x, g.const([-1, q.blocks, q.block_size])), g.const([2])],
                    f"{hint}/block_sums", keepdims=0)                            # [rows, blocks]
        offset_w = g.initializer(linear.name + ".block_offsets_fp32", np.ascontiguousarray(q.offsets.T))
        y = g.op("Add", [y, g.op("MatMul", [sums, offset_w], f"{hint}/offsets")], f"{hint}/with_offsets",
                 outputs=[output] if output and bias is None else None)
    if bias is not None:
        y = g.op("Add", [y, bias], f"{hint}/bias", outputs=[output] if output else None)
    return y
