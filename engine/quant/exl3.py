"""EXL3 (ExLlamaV3's trellis format) decoded on the CPU: the reference every faster path is checked against.

A quantized linear layer with K inputs and N outputs (both multiples of 128) is stored as
  trellis  int16 [K/16, N/16, 16*bits]  one 16x16 tile of W_q per (input tile, output tile), tiles row-major
  suh / su fp16 [K] scales, or int16 [K/16] packed signs (bit b of word w set: input 16w+b is negated)
  svh / sv fp16 [N] scales, or int16 [N/16] packed signs
  mcg / mul1  a scalar int32 marker naming the codebook (neither: the original "3inst")
  bias     fp16 [N], optional
and stands for y = x @ W + bias with W = diag(suh) · H · W_q · H · diag(svh), H the 128x128 Sylvester Hadamard
matrix / sqrt(128) applied to each block of 128 rows (left) and of 128 columns (right).

A tile: its 16*bits int16 words, taken in little-endian pairs, are 32-bit words; their bits, most significant
first, make one circular stream of 256*bits bits. Value p (0..255) is the 16-bit state that ends at bit E(p)
(exclusive, wrapping past the end): E(p) = (p+1)*bits, or for a half-integer width KA+0.5 (mul1 only) positions
alternate KA and KA+1 new bits, odd positions taking the extra one. A codebook maps each state to an fp16 value;
value p goes to the tile cell that the B operand fragments of two m16n8k16 MMAs give it (lane l = p // 8 holds
values 8l..8l+7), see `tile_cells`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

CODEBOOKS = ("3inst", "mcg", "mul1")
MARKERS = {"mcg": 0xCBAC1FED, "mul1": 0x83DCD12D}  # the marker tensors' stored values (as uint32)
WIDTHS = (1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8)  # every width the format defines; x.5 with mul1 only
HADAMARD_BLOCK = 128
TILE = 16

_3INST_MUL, _3INST_ADD = 89226354, 64248484
_FP16_MASK, _FP16_FLIP = 0x8FFF8FFF, 0x3B603B60  # keeps sign + low exponent bits: |halves| in [1/8, 2)
_MUL1_SCALE, _MUL1_BIAS = 0x1EEE, 0xC931  # fp16 bit patterns: 1/147.7 and -10.39


class Exl3FormatError(ValueError):
    """EXL3 tensors that do not follow the format; the message names the tensor and what was found."""


def width_of(words_per_tile: int) -> float:
    """Bits per weight from a trellis' last dimension (16*bits): 64 -> 4, 40 -> 2.5; 0 when no width fits."""
    bits = words_per_tile / TILE
    if words_per_tile % 8 or bits not in WIDTHS:
        return 0
    return int(bits) if bits.is_integer() else bits


# -- codebooks --------------------------------------------------------------------------------------------------


def _fp16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """int64 values 0..65535 read as fp16 bit patterns."""
    signed = torch.where(bits >= 32768, bits - 65536, bits)
    return signed.to(torch.int16).view(torch.float16)


@lru_cache(maxsize=len(CODEBOOKS))
def codebook(name: str) -> torch.Tensor:
    """The fp16 value of each of the 65536 states, [65536], for codebook `name`."""
    state = torch.arange(65536, dtype=torch.int64)
    if name == "mul1":
        x = (state * MARKERS["mul1"]) & 0xFFFFFFFF
        byte_sum = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + ((x >> 24) & 0xFF)
        scale = _fp16_from_bits(torch.tensor(_MUL1_SCALE)).double()
        bias = _fp16_from_bits(torch.tensor(_MUL1_BIAS)).double()
        # (1024 + byte_sum) * scale + bias is exact in fp64 and in fp32 (22 significant bits): one rounding to
        # fp16, as the fused multiply-add of the format's definition
        return ((1024 + byte_sum).double() * scale + bias).float().half()
    if name == "mcg":
        x = (state * MARKERS["mcg"]) & 0xFFFFFFFF
    elif name == "3inst":
        x = (state * _3INST_MUL + _3INST_ADD) & 0xFFFFFFFF
    else:
        raise Exl3FormatError(f"unknown EXL3 codebook {name!r}; known: {', '.join(CODEBOOKS)}")
    x = (x & _FP16_MASK) ^ _FP16_FLIP
    low, high = _fp16_from_bits(x & 0xFFFF).float(), _fp16_from_bits(x >> 16).float()
    return (low + high).half()  # the fp32 sum of two such halves is exact: one fp16 rounding


# -- one tile ---------------------------------------------------------------------------------------------------


@lru_cache(maxsize=len(WIDTHS))
def window_ends(bits: float) -> torch.Tensor:
    """E(p) for p = 0..255: the (exclusive) stream bit where value p's 16-bit state ends, [256] int64."""
    step = torch.arange(1, 257, dtype=torch.int64)
    if float(bits).is_integer():
        return step * int(bits)
    pair = int(2 * bits)  # bits per two positions: KA + (KA + 1)
    return (step * pair - step % 2) // 2


@lru_cache(maxsize=1)
def tile_cells() -> torch.Tensor:
    """Flat index (row * 16 + column) in its tile of each value p = 0..255; rows index inputs (K)."""
    p = torch.arange(256)
    lane, j = p // 8, p % 8
    rows = 2 * (lane % 4) + (j & 1) + 8 * ((j >> 1) & 1)
    cols = lane // 4 + 8 * (j >> 2)
    return rows * TILE + cols


def tile_states(trellis: torch.Tensor, bits: float) -> torch.Tensor:
    """The 16-bit state of every value: [..., 256] int64 from trellis int16 [..., 16*bits]."""
    words16 = trellis.to(torch.int64) & 0xFFFF
    words = words16[..., 0::2] | (words16[..., 1::2] << 16)  # [..., 8*bits] 32-bit words
    count = words.shape[-1]
    start = window_ends(bits) - 16 + 32 * count  # first bit of each window, kept >= 0
    first, offset = (start // 32) % count, start % 32
    lead, follow = words[..., first], words[..., (first + 1) % count]
    window48 = (lead << 16) | (follow >> 16)  # the 48 stream bits from `first`'s MSB
    return (window48 >> (32 - offset)) & 0xFFFF


def unpack(trellis: torch.Tensor, codebook_name: str) -> torch.Tensor:
    """W_q [K, N] fp16, the weight in the rotated basis, from trellis int16 [K/16, N/16, 16*bits]."""
    if trellis.dtype != torch.int16 or trellis.dim() != 3:
        raise Exl3FormatError(f"trellis must be int16 [K/16, N/16, 16*bits], got {trellis.dtype} {list(trellis.shape)}")
    bits = width_of(trellis.shape[-1])
    if not bits:
        raise Exl3FormatError(f"trellis last dimension {trellis.shape[-1]} is not 16*bits for a width in {WIDTHS}")
    if not float(bits).is_integer() and codebook_name != "mul1":
        raise Exl3FormatError(f"{bits}-bit tiles need the mul1 codebook, got {codebook_name}")
    k_tiles, n_tiles = trellis.shape[:2]
    values = codebook(codebook_name)[tile_states(trellis, bits)]  # [kt, nt, 256] in stream order
    tiles = torch.empty_like(values)
    tiles[..., tile_cells()] = values
    return tiles.view(k_tiles, n_tiles, TILE, TILE).transpose(1, 2).reshape(k_tiles * TILE, n_tiles * TILE)


def unpack_signs(packed: torch.Tensor) -> torch.Tensor:
    """su / sv int16 [n/16] -> fp16 [n] of +1 / -1 (bit b of word w set: element 16w+b is -1)."""
    words = packed.to(torch.int64).reshape(-1, 1) & 0xFFFF
    negative = (words >> torch.arange(TILE)) & 1
    return (1 - 2 * negative).reshape(-1).half()


# -- the layer --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=2)
def hadamard(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The 128x128 Sylvester Hadamard matrix / sqrt(128): H[i, j] = (-1)^popcount(i & j) / sqrt(128)."""
    i = torch.arange(HADAMARD_BLOCK)
    parity = torch.zeros(HADAMARD_BLOCK, HADAMARD_BLOCK, dtype=torch.int64)
    both = i[:, None] & i[None, :]
    for bit in range(7):
        parity ^= (both >> bit) & 1
    return ((1 - 2 * parity).double() / math.sqrt(HADAMARD_BLOCK)).to(dtype)


def rotate(x: torch.Tensor, dim: int) -> torch.Tensor:
    """H applied to every block of 128 along `dim`, as a fast Walsh-Hadamard transform (H is symmetric: left and
    right products agree). Its butterflies give exactly `blocks @ hadamard()`'s sums, in fewer operations."""
    moved = x.movedim(dim, -1)
    size = moved.shape[-1]
    if size % HADAMARD_BLOCK:
        raise Exl3FormatError(f"a rotated dimension must be a multiple of {HADAMARD_BLOCK}, got {size}")
    y = moved.reshape(moved.numel() // HADAMARD_BLOCK, HADAMARD_BLOCK)
    half = 1
    while half < HADAMARD_BLOCK:
        pairs = y.view(y.shape[0], HADAMARD_BLOCK // (2 * half), 2, half)
        y = torch.stack((pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]), dim=2)
        half *= 2
    y = y.reshape(moved.shape) * (1 / math.sqrt(HADAMARD_BLOCK))
    return y.movedim(-1, dim)


@dataclass(frozen=True)
class Exl3Linear:
    """One EXL3 layer's tensors as stored (see the module docstring); `suh`/`svh` already unpacked from signs."""

    trellis: torch.Tensor  # int16 [K/16, N/16, 16*bits]
    suh: torch.Tensor  # fp16 [K]
    svh: torch.Tensor  # fp16 [N]
    codebook: str = "3inst"
    bias: torch.Tensor | None = None

    @property
    def bits(self) -> float:
        return width_of(self.trellis.shape[-1])

    @property
    def in_features(self) -> int:
        return self.trellis.shape[0] * TILE

    @property
    def out_features(self) -> int:
        return self.trellis.shape[1] * TILE

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [K, N] (y = x @ W): rotations and scales in fp64 on the exact fp16 W_q, rounded once to `dtype`."""
        w = rotate(unpack(self.trellis, self.codebook).double(), 0) * self.suh.double()[:, None]
        return (rotate(w, 1) * self.svh.double()[None, :]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y = x @ W + bias in x's dtype, ordered as the kernels do: rotate the input, W_q, rotate the output."""
        wq = unpack(self.trellis, self.codebook).to(x.dtype)
        y = rotate(rotate(x * self.suh.to(x.dtype), -1) @ wq, -1) * self.svh.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


@dataclass(frozen=True)
class Exl3Bank:
    """Matrices of one shape and one format stacked so a kernel picks matrix i by an index read on the device (a
    MoE layer's routed experts): trellis int16 [M, K/16, N/16, 16*bits], suh fp16 [M, K], svh fp16 [M, N]."""

    trellis: torch.Tensor
    suh: torch.Tensor
    svh: torch.Tensor
    codebook: str

    def __len__(self) -> int:
        return self.trellis.shape[0]

    def linear(self, i: int) -> Exl3Linear:
        return Exl3Linear(self.trellis[i], self.suh[i], self.svh[i], self.codebook)
