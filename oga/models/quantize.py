"""Block-quantized linear weights in ONNX Runtime's `com.microsoft.MatMulNBits` layout.

A linear weight W [N, K] (Hugging Face layout: out_features x in_features) is cut along K into
blocks of `block_size` values; block b of row n holds `bits`-bit codes q, a float scale s, an
integer zero point z and, for some sources, a float offset c:

    w = (q - z) * s (+ c)

MatMulNBits computes the (q - z) * s part from

    B            uint8 [N, ceil(K / block_size), block_size * bits / 8]   the codes, row by row;
                 4-bit: element 2i in the low nibble of byte i, element 2i+1 in the high nibble
    scales       float32 [N * ceil(K / block_size)]
    zero_points  (optional) uint8: 4-bit [N * ceil(blocks / 2)] (two per byte, low nibble first),
                 8-bit [N * blocks]; absent: 2^(bits-1)

and the graph adds the offsets as blocksums(x) @ C^T (linear_weights.py). ONNX Runtime's CPU
MatMulNBits also accepts float zero points, which would hold w = d q + m directly as z = -m / d,
but then dequantizes the whole weight on every call (measured 45x slower at batch 1 than with
uint8 zero points), so offsets are kept apart.

Two ways in:
- `from_gguf`: GGUF Q4_0, Q4_1 and Q8_0 blocks (32 values each) are repacked, never re-quantized,
  so the graph computes with exactly the weights llama.cpp does:
      Q4_0  w = d * (q - 8), q in 0..15       -> scale d, default zero point 8
      Q4_1  w = d * q + m,   q in 0..15       -> scale d, zero point 0, offset m (an fp16 value)
      Q8_0  w = d * q,       q in -128..127   -> codes q + 128, default zero point 128
  GGUF keeps a 4-bit block's first 16 values in the low nibbles of its 16 bytes and the last 16
  in the high nibbles; MatMulNBits pairs neighbours, so the codes are re-paired.
- `quantize`: any float weight, round to nearest per block with a uint8 zero point
  (asymmetric min/max, the block's range mapped onto 0 .. 2^bits - 1), no offsets.

K must be a multiple of the block size (every GGUF quantized tensor is); `BlockQuantized.dequantize`
gives the float32 weight the graph computes with, which the numpy reference uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK_SIZE = 32
GGUF_EXACT_TYPES = ("Q4_0", "Q4_1", "Q8_0")     # GGUF block types MatMulNBits represents exactly


@dataclass
class BlockQuantized:
    """One linear weight [n, k] in MatMulNBits form (see the module docstring)."""

    bits: int                      # 4 or 8
    block_size: int
    n: int                         # rows (out_features)
    k: int                         # columns (in_features), a multiple of block_size
    codes: np.ndarray              # uint8 [n, k / block_size, block_size]: one code per value, unpacked
    scales: np.ndarray             # float32 [n, k / block_size]
    zero_points: np.ndarray | None  # uint8 [n, k / block_size], or None: the default 2^(bits-1)
    offsets: np.ndarray | None     # float32 [n, k / block_size] added to every value of the block, or None
    source: str                    # "Q4_1", ... when repacked from GGUF; "rtn" when quantized here

    @property
    def blocks(self) -> int:
        return self.k // self.block_size

    def zero_point_values(self) -> np.ndarray:
        """uint8 [n, blocks]: every block's zero point, the default included."""
        if self.zero_points is None:
            return np.full((self.n, self.blocks), 2 ** (self.bits - 1), dtype=np.uint8)
        return self.zero_points

    def dequantize(self) -> np.ndarray:
        """The float32 weight [n, k] the graph computes with: (q - z) * s + c."""
        q = self.codes.astype(np.float32)
        w = (q - self.zero_point_values()[:, :, None].astype(np.float32)) * self.scales[:, :, None]
        if self.offsets is not None:
            w = w + self.offsets[:, :, None]
        return w.reshape(self.n, self.k)

    def take_rows(self, rows: np.ndarray) -> "BlockQuantized":
        """The weight with its rows reordered (rows[i] becomes row i); blocks run along k, so a row
        permutation moves whole blocks and changes no value."""
        rows = np.asarray(rows)
        pick = (lambda a: None if a is None else a[rows])
        return BlockQuantized(self.bits, self.block_size, len(rows), self.k, self.codes[rows], self.scales[rows],
                              pick(self.zero_points), pick(self.offsets), self.source)

    # ---- MatMulNBits initializers -------------------------------------------------------------

    def packed_codes(self) -> np.ndarray:
        """uint8 [n, blocks, block_size * bits / 8] (MatMulNBits input B)."""
        if self.bits == 8:
            return np.ascontiguousarray(self.codes)
        return np.ascontiguousarray(self.codes[:, :, 0::2] | (self.codes[:, :, 1::2] << 4))

    def flat_scales(self) -> np.ndarray:
        return np.ascontiguousarray(self.scales.reshape(-1), dtype=np.float32)

    def packed_zero_points(self) -> np.ndarray | None:
        """MatMulNBits' zero_points input, or None when every block has the default."""
        if self.zero_points is None:
            return None
        z = self.zero_points
        if self.bits == 8:
            return np.ascontiguousarray(z.reshape(-1))
        if self.blocks % 2:
            z = np.concatenate([z, np.zeros((self.n, 1), dtype=np.uint8)], axis=1)
        return np.ascontiguousarray((z[:, 0::2] | (z[:, 1::2] << 4)).reshape(-1))


def concat_rows(parts: list[BlockQuantized]) -> BlockQuantized:
    """Weights stacked along n (fused projections such as q|k|v); all parts share bits, block size
    and k. Zero points and offsets become explicit when the parts differ in having them."""
    first = parts[0]
    for p in parts[1:]:
        if (p.bits, p.block_size, p.k) != (first.bits, first.block_size, first.k):
            raise ValueError(f"cannot fuse {p.bits}-bit / block {p.block_size} / k {p.k} rows with "
                             f"{first.bits}-bit / block {first.block_size} / k {first.k} rows")
    zero_points = None
    if any(p.zero_points is not None for p in parts):
        zero_points = np.concatenate([p.zero_point_values() for p in parts], axis=0)
    offsets = None
    if any(p.offsets is not None for p in parts):
        offsets = np.concatenate([p.offsets if p.offsets is not None else np.zeros((p.n, p.blocks), np.float32)
                                  for p in parts], axis=0)
    sources = sorted({p.source for p in parts})
    return BlockQuantized(first.bits, first.block_size, sum(p.n for p in parts), first.k,
                          np.concatenate([p.codes for p in parts], axis=0),
                          np.concatenate([p.scales for p in parts], axis=0), zero_points, offsets, "+".join(sources))


# ---- GGUF blocks --------------------------------------------------------------------------------

def _gguf_blocks(raw: np.ndarray, n: int, k: int, block_bytes: int) -> np.ndarray:
    """uint8 [n, k / 32, block_bytes]: the raw blocks of a GGUF tensor stored row by row."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    expected = n * (k // BLOCK_SIZE) * block_bytes
    if raw.size != expected:
        raise ValueError(f"GGUF tensor data holds {raw.size} bytes, expected {expected} for [{n}, {k}]")
    return raw.reshape(n, k // BLOCK_SIZE, block_bytes)


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 field at byte `offset` of every block, as float32 [n, blocks]."""
    return np.ascontiguousarray(blocks[:, :, offset:offset + 2]).view(np.float16)[:, :, 0].astype(np.float32)


def _gguf_nibbles(qs: np.ndarray) -> np.ndarray:
    """GGUF 4-bit codes [n, blocks, 16 bytes] -> one code per value [n, blocks, 32] in value order
    (values 0..15 in the low nibbles, 16..31 in the high nibbles)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2)


def from_gguf(type_name: str, raw: np.ndarray, n: int, k: int) -> BlockQuantized:
    """A GGUF Q4_0 / Q4_1 / Q8_0 tensor [n, k] (raw block bytes, row by row) repacked exactly."""
    if type_name not in GGUF_EXACT_TYPES:
        raise ValueError(f"GGUF type {type_name} has no exact MatMulNBits form ({', '.join(GGUF_EXACT_TYPES)} do)")
    if k % BLOCK_SIZE:
        raise ValueError(f"a GGUF {type_name} tensor has k = {k}, not a multiple of {BLOCK_SIZE}")
    if type_name == "Q8_0":                                       # d: f16, qs: int8[32]
        blocks = _gguf_blocks(raw, n, k, 34)
        codes = (blocks[:, :, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return BlockQuantized(8, BLOCK_SIZE, n, k, codes, _f16(blocks, 0), None, None, type_name)
    if type_name == "Q4_0":                                       # d: f16, qs: u8[16]
        blocks = _gguf_blocks(raw, n, k, 18)
        return BlockQuantized(4, BLOCK_SIZE, n, k, _gguf_nibbles(blocks[:, :, 2:]), _f16(blocks, 0), None, None,
                              type_name)
    blocks = _gguf_blocks(raw, n, k, 20)                          # Q4_1: d: f16, m: f16, qs: u8[16]
    return BlockQuantized(4, BLOCK_SIZE, n, k, _gguf_nibbles(blocks[:, :, 4:]), _f16(blocks, 0),
                          np.zeros((n, k // BLOCK_SIZE), dtype=np.uint8), _f16(blocks, 2), type_name)


# ---- round to nearest ---------------------------------------------------------------------------

def quantize(w: np.ndarray, bits: int, block_size: int = BLOCK_SIZE) -> BlockQuantized:
    """Round-to-nearest asymmetric quantization of a float weight [n, k] (k a multiple of
    block_size): per block, [min, max] (widened to hold 0) maps onto codes 0 .. 2^bits - 1."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"a linear weight is 2-D, got shape {w.shape}")
    n, k = w.shape
    if k % block_size:
        raise ValueError(f"k = {k} is not a multiple of the block size {block_size}")
    levels = 2 ** bits - 1
    blocks = w.reshape(n, k // block_size, block_size).astype(np.float64)
    lo = np.minimum(blocks.min(axis=2), 0.0)
    hi = np.maximum(blocks.max(axis=2), 0.0)
    scale = (hi - lo) / levels
    safe = np.where(scale > 0, scale, 1.0)
    zero = np.clip(np.round(-lo / safe), 0, levels)
    codes = np.clip(np.round(blocks / safe[:, :, None]) + zero[:, :, None], 0, levels).astype(np.uint8)
    scale32 = np.where(scale > 0, scale, 0.0).astype(np.float32)
    return BlockQuantized(bits, block_size, n, k, codes, scale32, zero.astype(np.uint8), None, "rtn")
