"""Dense (non-expert) weights stored in fewer bits at load: `DENSE=q4 | fp8 | bf16`.

- **q4**: each output row of a [out, in] weight in groups of GROUP inputs; a group holds 4-bit codes q in 0..15 and
  an fp16 scale s and offset z, w ≈ q·s + z. The range of a group is searched: for each of CLIPS the group's
  [min, max] is shrunk by that factor around its middle, codes rounded and clamped, and the factor with the least
  squared error kept (deterministic: a fixed list, ties to the first). Codes are packed two a byte within each group:
  byte j of a group's 32 (of an output's row) holds the group's input j in its low nibble and input 32 + j in its
  high one, so each nibble half of a group meets 32 consecutive inputs.
- **fp8**: e4m3 with an fp32 scale (amax / 448) per output row and GROUP inputs: a per-output-channel scale taken
  group by group. (One scale over a whole row would differ between TP=1 and a rank holding half the row's inputs.)

The weights are stored output-major — [outputs, inputs/2] q4 bytes, [outputs, inputs] e4m3 — so the decode kernel
(engine/ops/triton_dense.py) loads each output's bytes as vectors straight into the tensor cores' operand registers
(tiled where the padding is small, `tiled_shape`: TILE outputs' bytes of one group side by side, so a program of the
kernel reads one run of memory); scales (and offsets) input-major — [inputs/GROUP, outputs], the outputs contiguous
— so it reads a group's scales for a block of outputs as one row. A q4 group's scale and offset lie side by side
(`QuantWeight.pairs`, [inputs/GROUP, outputs, 2] fp16: `scale` and `offset` are its two views), so the kernel loads
them as one 32-bit word an output: half the load instructions of two separate rows (session 44 measured what those
loads cost, docs/BENCHMARKS.md). A weight's groups lie along its input, so a tensor-parallel rank's slice holds
whole groups of the full matrix (a column split cuts output rows; a row split cuts inputs at head boundaries,
multiples of GROUP at the real widths) and quantising a slice gives the bits of the same slice of the quantised
whole. A q4 weight whose input width is not a multiple of GROUP stays as loaded (`quantize` says so by returning
it); fp8 takes any width (a last, shorter group).

What stays in the loaded precision (the modules in engine/models/glm5_next/ apply their `store` to the rest): norms, the router (fp32 products, it picks
experts), the hyper-connection maps (fp32 products), embeddings, the absorbed MLA kv_b (per-head einsums) and the routed
experts (EXL3 or as stored: the experts are not dense weights). The LM head is stored fp8 in both reduced modes
(HEAD_MODE; docs/QUALITY.md has the measurement behind it).

`QuantWeight` is what `engine.ops.linear` takes in place of a tensor: on the CPU a reference product (dequantise,
then the fp32 matmul); on CUDA engine/ops/triton_dense.py (decode rows and verify windows, row-invariant) or a
dequantised bf16 matmul (prompt chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from engine.config import DENSE_MODES as MODES

GROUP = 64
CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)
HEAD_MODE = {"q4": "fp8", "fp8": "fp8", "bf16": "bf16"}
FP8_MAX = 448.0
_ROWS_AT_ONCE = 2048  # rows quantised per pass (bounds the search's temporary memory)
# the codes kept tiled, TILE outputs a tile (`QuantWeight`, `tile`; the decode kernel's block of outputs): a decode
# product's program (on a weight, or a slice from a tile's first row as the model's are) then reads one run of
# memory, where from rows a whole input apart it read a group's 32 (q4) or 64 (fp8) bytes of each row. On an H100 the
# served weights' products took up to 17 % less (kda_in_proj q4 30.7 -> 25.4 µs at one row, 33.3 -> 28.5 at 8; the
# fp8 LM head 243.5 -> 226.1), within 2 % at worst (docs/BENCHMARKS.md, session 48). The outputs are padded to whole
# tiles, so a weight is tiled only where that adds under 1 % to its rows (`kept_bytes` does not count it)
TILE = 128


def tiled_shape(out: int, width: int, group: int = GROUP) -> bool:
    """Whether `quantize` keeps a [out, width] weight's codes tiled: whole groups, and padding the outputs to whole
    tiles adds under 1 % to them."""
    return width % group == 0 and 100 * (-out % TILE) < out


# the checkpoint tensors the model keeps in the dense mode (its `store` calls), by name ending; routed experts
# (`.mlp.experts.N.`) and the vision tower (not loaded) excluded
STORED = (
    *(f".{n}_proj.weight" for n in ("q", "k", "v", "f_a", "g_a", "b", "f_b", "g_b", "o", "q_a", "q_b", "eh")),
    ".kv_a_proj_with_mqa.weight",
    ".indexer.wk.weight",
    ".indexer.wq_b.weight",
    ".indexer.weights_proj.weight",
    ".indexer.index_kpool_compress_gate",
    *(f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")),
    *(f"shared_experts.{n}_proj.weight" for n in ("gate", "up", "down")),
)


class QuantWeight:
    """A [out, in] weight in `mode` (q4 | fp8). q4: `data` uint8 [out, in/2], `scale` and `offset` fp16
    [in/group, out], the two views of `pairs` [in/group, out, 2] (each group's scale and offset side by side; given
    apart, they are interleaved into a new `pairs`); fp8: `data` float8_e4m3fn [out, in], `scale` fp32
    [ceil(in/group), out] (`offset` and `pairs` None). Output slices (`rows`) are views.

    Tiled (`tile`, where `tiled_shape` says): `data` is [blocks, groups, TILE, a group's bytes]
    — TILE outputs' bytes of one group side by side, then the next group's — the outputs padded to whole tiles; the
    weight's outputs are the tiled rows first .. first + out (a row slice keeps the parent's `data`)."""

    def __init__(
        self,
        mode: str,
        data: torch.Tensor,
        scale: torch.Tensor | None,
        offset: torch.Tensor | None,
        group: int,
        pairs: torch.Tensor | None = None,
        first: int = 0,
    ) -> None:
        if pairs is None and offset is not None:
            assert scale is not None
            pairs = torch.stack([scale, offset], dim=-1).contiguous()
        if pairs is not None:
            scale, offset = pairs[..., 0], pairs[..., 1]
        assert scale is not None
        self.mode, self.data, self.scale, self.offset, self.group = mode, data, scale, offset, group
        self.pairs = pairs
        self.tiled = data.dim() == 4
        assert not self.tiled or data.is_contiguous(), "tiled codes are read by their offsets: contiguous"
        self.first = first
        self.out = scale.shape[1]  # the outputs (a tiled weight's data holds its parent's, padded)

    def words(self) -> torch.Tensor:
        """q4: `pairs` as one int32 an output and group ([in/group, out], the scale's bits low, the offset's high:
        what the decode kernel loads)."""
        assert self.pairs is not None, "fp8 weights have no offsets"
        return self.pairs.view(torch.int32)[..., 0]

    @property
    def row_bytes(self) -> int:
        """The bytes of an output's row (a tiled weight's too: a tile's row of one group times the groups)."""
        return self.data.shape[1] * self.data.shape[3] if self.tiled else self.data.shape[1]

    @property
    def shape(self) -> torch.Size:
        stored = self.row_bytes
        return torch.Size((self.out, stored * 2 if self.mode == "q4" else stored))

    def rows(self, start: int, stop: int) -> QuantWeight:
        """Output rows start..stop (views: nothing is copied)."""
        assert 0 <= start <= stop <= self.out, f"rows {start}..{stop} of {self.out}"
        pairs = None if self.pairs is None else self.pairs[:, start:stop]  # q4: scale and offset come from these
        data = self.data if self.tiled else self.data[start:stop]
        first = self.first + start if self.tiled else 0
        return QuantWeight(self.mode, data, self.scale[:, start:stop], None, self.group, pairs, first)

    def codes(self) -> torch.Tensor:
        """The stored bytes as [out, row_bytes], outputs in order (a tiled weight's: a new tensor)."""
        if not self.tiled:
            return self.data
        start, stop = self.first // TILE, -(-(self.first + self.out) // TILE)  # the tiles holding these rows
        rows = self.data[start:stop].permute(0, 2, 1, 3).reshape(-1, self.row_bytes)
        return rows[self.first - start * TILE :][: self.out]

    def split(self, widths: Sequence[int]) -> list[QuantWeight]:
        """Consecutive output-row blocks of these widths, as `torch.Tensor.split` along dim 0."""
        out, start = [], 0
        for width in widths:
            out.append(self.rows(start, start + width))
            start += width
        return out

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight [out, in] as `dtype` (the values the codes stand for, computed in fp32)."""
        data = self.codes()
        if self.mode == "fp8":
            width = data.shape[1]
            scales = self.scale.t().repeat_interleave(self.group, dim=1)[:, :width]
            return (data.float() * scales).to(dtype)
        out, half = data.shape
        packed = data.reshape(out, half * 2 // self.group, 1, self.group // 2)
        codes = torch.cat([packed & 15, packed >> 4], dim=2).view(out, -1, self.group).float()  # [out, groups, group]
        offset = self.offset.t().float()[..., None]  # type: ignore[union-attr]
        return (codes * self.scale.t().float()[..., None] + offset).view(out, half * 2).to(dtype)

    def nbytes(self) -> int:
        """The bytes this weight's outputs read: its codes (a tiled weight's own rows) and its scales."""
        scales = self.scale if self.pairs is None else self.pairs
        return self.out * self.row_bytes * self.data.element_size() + scales.numel() * scales.element_size()


def kept_bytes(name: str, shape: Sequence[int], mode: str) -> float | None:
    """Bytes per value a checkpoint tensor takes once loaded with DENSE=`mode`, or None where it stays as loaded
    (`engine fit` and `engine info` count with it; the model's `store` calls make the same choice). A tiled weight's
    padding to whole tiles is not counted: under 1 % of its rows (`tiled_shape`)."""
    if name == "lm_head.weight" or name.endswith(".lm_head.weight"):
        mode = HEAD_MODE[mode]
    elif ".mlp.experts." in name or "visual." in name or not name.endswith(STORED):
        return None
    if mode == "bf16" or len(shape) != 2:
        return None
    if mode == "fp8":
        return 1 + 4 * -(-shape[1] // GROUP) / shape[1]
    return None if shape[1] % GROUP else 0.5 + 4 / GROUP


Weight = torch.Tensor | QuantWeight  # what `engine.ops.linear` takes
Store = Callable[[torch.Tensor], Weight]  # how a module keeps a dense weight it has just read


def keep(weight: torch.Tensor) -> Weight:
    """The dense weights as loaded (DENSE=bf16; on the CPU, the reference fp32)."""
    return weight


def storer(mode: str) -> Store:
    """How the dense weights are kept in `mode`."""
    return keep if mode == "bf16" else partial(quantize, mode=mode)


def quantize(weight: torch.Tensor, mode: str, group: int = GROUP) -> torch.Tensor | QuantWeight:
    """`weight` [out, in] stored in `mode`; bf16 (or a q4 weight whose input width is not a multiple of `group`) comes
    back unchanged."""
    if mode not in MODES:
        raise ValueError(f"dense mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "bf16" or weight.dim() != 2:
        return weight
    if mode == "q4" and weight.shape[1] % group:
        return weight
    rows = _q4_rows if mode == "q4" else _fp8_rows
    parts = [rows(weight[i : i + _ROWS_AT_ONCE], group) for i in range(0, weight.shape[0], _ROWS_AT_ONCE)]
    data = torch.cat([p[0] for p in parts]).contiguous()
    scale = torch.cat([p[1] for p in parts], dim=1)
    offsets = [p[2] for p in parts if p[2] is not None]
    offset = torch.cat(offsets, dim=1) if offsets else None
    del parts, offsets  # the codes' peak while tiling: the rows and the tiles, no more
    if tiled_shape(weight.shape[0], weight.shape[1], group):
        data = tile(data, group // 2 if mode == "q4" else group)
    return QuantWeight(mode, data, scale.contiguous() if offset is None else scale, offset, group)


def tile(data: torch.Tensor, per: int) -> torch.Tensor:
    """Stored bytes [out, in bytes] (`per` a group's) as [blocks, groups, TILE, per], the outputs padded to whole
    tiles with zeros: a block's rows of one group side by side, the block's next group after them."""
    out, width = data.shape
    whole, rest = divmod(out, TILE)
    tiles = data.new_zeros(whole + (rest > 0), width // per, TILE, per)
    rows = tiles.transpose(1, 2)  # [blocks, TILE, groups, per]: the tiles seen in the rows' order
    rows[:whole].copy_(data[: whole * TILE].view(whole, TILE, width // per, per))
    if rest:
        rows[whole, :rest].copy_(data[whole * TILE :].view(rest, width // per, per))
    return tiles


def _fp8_rows(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, None]:
    """Rows of a weight -> e4m3 values [rows, in] and scales [ceil(in/group), rows]."""
    out, width = weight.shape
    w = weight.float()
    padded = torch.nn.functional.pad(w, (0, -width % group)).view(out, -1, group)
    scale = (padded.abs().amax(dim=2) / FP8_MAX).clamp(min=1e-12)  # [rows, groups]
    data = (w / scale.repeat_interleave(group, dim=1)[:, :width]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return data, scale.t(), None


def _q4_rows(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a weight -> packed codes [rows, in/2], scales and offsets [in/group, rows] (the searched range per
    group)."""
    out, width = weight.shape
    w = weight.float().view(out, width // group, group)
    low, high = w.amin(-1), w.amax(-1)
    middle, half = (high + low) / 2, (high - low) / 2
    best_err = best_scale = best_offset = None
    for clip in CLIPS:
        lo = middle - half * clip
        scale = ((2 * half * clip) / 15).clamp(min=1e-8).half()
        offset = lo.half()
        codes = torch.round((w - offset.float()[..., None]) / scale.float()[..., None]).clamp(0, 15)
        err = ((codes * scale.float()[..., None] + offset.float()[..., None] - w) ** 2).sum(-1)
        if best_err is None:
            best_err, best_scale, best_offset = err, scale, offset
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_scale = torch.where(better, scale, best_scale)  # type: ignore[arg-type]
            best_offset = torch.where(better, offset, best_offset)  # type: ignore[arg-type]
    assert best_scale is not None and best_offset is not None
    codes = torch.round((w - best_offset.float()[..., None]) / best_scale.float()[..., None]).clamp(0, 15)
    codes = codes.to(torch.uint8)  # [rows, groups, group]
    lows = group // 2  # a group's inputs 0..31 go to the low nibbles, 32..63 to the high ones
    packed = (codes[..., :lows] | (codes[..., lows:] << 4)).view(out, width // 2)
    return packed, best_scale.t(), best_offset.t()
