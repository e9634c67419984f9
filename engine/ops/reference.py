"""Plain-torch kernels: the numerical definition every faster backend is checked against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.config import MAX_STEP_ROWS

ROW_INVARIANT_ROWS = MAX_STEP_ROWS  # products of up to this many rows are row-invariant (decode steps, verify windows)
CPU_ROW_BLOCK = 8  # ... computed on the CPU as products of exactly this many rows (zero-padded)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [N, in] (fp32 activations, or rows a kernel wrote in the weight's type) times weight [out, in] stored in any
    float dtype; fp32 result.
    The product runs in the weight's dtype (bf16 on GPUs, accumulating in fp32); on the CPU everything is fp32.

    Row invariance: MKL and cuBLAS choose how to block a product by its row count, so a row's result moves in the
    last bits with the batch. Up to ROW_INVARIANT_ROWS rows run through `row_blocks` (products of a fixed row
    count); a row's bits are then the same whatever shares the step (drafted ≡ serial rests on it,
    tests/engine/test_drafts.py, tests/gpu/test_drafts_gpu.py)."""
    if x.dim() == 2 and x.shape[0] <= ROW_INVARIANT_ROWS:
        if _cast_for(x, weight):  # where row_blocks pads, its copy casts the rows too (one launch, not two)
            return row_blocks(lambda rows: _fp32_product(rows, weight.t()), x, kind="linear", dtype=weight.dtype)
        return row_blocks(lambda rows: _product(rows, weight), x, kind="linear")
    return _product(x, weight)


def _cast_for(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """fp32 rows times a bf16 / fp16 weight: the product takes the rows cast to the weight's type."""
    return x.dtype == torch.float32 and weight.dtype in (torch.bfloat16, torch.float16)


def _product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if weight.dtype == x.dtype:  # rows already in the weight's type (a kernel wrote them so): fp32 out all the same
        return x @ weight.t() if x.dtype == torch.float32 else _fp32_product(x, weight.t())
    return _fp32_product(x.to(weight.dtype), weight.t())


def _padded(x: torch.Tensor, rows: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """x as `dtype` (default its own) with rows appended up to a multiple of `rows`: zeros on the CPU; on CUDA an
    uninitialised block the rows are copied (and cast) into, one launch instead of a zero fill, a concatenation and
    a cast (0.5 ms of a 45-layer step on the H200, docs/BENCHMARKS.md, session 17): `row_blocks` calls are row-wise,
    so the padding rows' values reach only their own results, which are dropped."""
    dtype = dtype or x.dtype
    pad = -x.shape[0] % rows
    if not x.is_cuda:
        return (torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad else x).to(dtype)
    if not pad and dtype == x.dtype:
        return x
    out = x.new_empty((x.shape[0] + pad, *x.shape[1:]), dtype=dtype)
    out[: x.shape[0]] = x
    return out


# On CUDA, `row_blocks` pads only once a verify step may run (`require_row_invariance`, called by a lane decoder
# with drafts): measured on the H200 (docs/BENCHMARKS.md), the products (linear), the norms and the DSA lane
# attention must run at a fixed row count for a row's bits to be those of the row alone; fp32-weight products, RMS
# norms and the lane attention skip the padding through kernels that are per row by construction
# (engine/ops/triton_rows.py, triton_dsa.py: `fused.linear`, `fused.head_products`, `fused.rms_norm`,
# `fused.lane_attention`; the padded forms stay their fallbacks), and what is left costs a 45-layer decode step
# nothing measurable (session 19; ~1.5 % in session 17); without drafts nothing needs it and nothing pays for it.
CUDA_ROW_BLOCKS: set[str] = set()  # the kinds of `row_blocks` call that pad on CUDA
CUDA_ROW_BLOCK = 16  # rows a padded CUDA call computes ...
CUDA_KIND_BLOCK = {"dsa_attend": 1}  # ... or this many for a kind (the lane attention's latents are large: per row)
ROW_INVARIANT_KINDS = ("linear", "norm", "dsa_heads", "dsa_attend")


def require_row_invariance() -> None:
    """From now on this process computes a row's logits with the same bits whatever shares the step (CUDA; the
    CPU always does)."""
    CUDA_ROW_BLOCKS.update(ROW_INVARIANT_KINDS)


def pads_on_cuda(kind: str) -> bool:
    """Whether a CUDA call of this `row_blocks` kind must give a row the bits it has alone (a verify step may run)."""
    return kind in CUDA_ROW_BLOCKS


def row_blocks(fn: Callable[..., Any], *xs: torch.Tensor, kind: str = "rows", dtype: torch.dtype | None = None) -> Any:
    """fn(*xs) for a row-wise fn (row i of each result depends on row i of each x alone; it returns a tensor or a
    tuple of them), so that a row's bits do not depend on how many rows share the call: up to ROW_INVARIANT_ROWS
    rows, fn runs on blocks of a fixed row count (the last padded: zero rows on the CPU, uninitialised ones on CUDA,
    `_padded`): CPU_ROW_BLOCK on the CPU (every block the same MKL call; measured: a row's result depends neither on
    its place in a block nor on the other rows); on CUDA, for the kinds in CUDA_ROW_BLOCKS, CUDA_ROW_BLOCK (or
    CUDA_KIND_BLOCK[kind]) rows, one kernel choice whatever the batch. torch's products, batched products and, on
    CUDA, its reductions choose their blocking by the batch size otherwise. `dtype`: fn takes the floating-point xs
    cast to it (by the padding copy where there is one)."""
    n = xs[0].shape[0]
    types = [dtype if dtype is not None and x.is_floating_point() else x.dtype for x in xs]
    if n > ROW_INVARIANT_ROWS or (xs[0].is_cuda and kind not in CUDA_ROW_BLOCKS):
        return fn(*(x.to(t) for x, t in zip(xs, types)))
    block = CUDA_KIND_BLOCK.get(kind, CUDA_ROW_BLOCK) if xs[0].is_cuda else CPU_ROW_BLOCK
    padded = [_padded(x, block, t) for x, t in zip(xs, types)]
    parts = [fn(*(x[i : i + block] for x in padded)) for i in range(0, padded[0].shape[0], block)]
    if isinstance(parts[0], tuple):
        return tuple((column[0] if len(column) == 1 else torch.cat(column))[:n] for column in zip(*parts))
    return (parts[0] if len(parts) == 1 else torch.cat(parts))[:n]


def linear_pairs(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """P independent products in one batched matmul: x [P, N, in] times weight [P, out, in] -> [P, N, out] fp32;
    row-invariant over N as `linear` is."""
    if x.shape[1] <= ROW_INVARIANT_ROWS:
        by_row = x.transpose(0, 1)  # [N, P, in]
        if _cast_for(x, weight):  # as in `linear`: the padding copy casts
            return row_blocks(
                lambda rows: _fp32_product(rows.transpose(0, 1), weight.transpose(1, 2)).transpose(0, 1),
                by_row,
                kind="linear",
                dtype=weight.dtype,
            ).transpose(0, 1)
        return row_blocks(
            lambda rows: _pairs(rows.transpose(0, 1), weight).transpose(0, 1), by_row, kind="linear"
        ).transpose(0, 1)
    return _pairs(x, weight)


def _pairs(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if weight.dtype == x.dtype:
        return x @ weight.transpose(1, 2)
    return _fp32_product(x.to(weight.dtype), weight.transpose(1, 2))


_FP32_OUT = [True]  # cleared when this torch cannot write a bf16 product straight to fp32 on the GPU


def _fp32_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of low-precision (2-D or batched 3-D) operands, as fp32. On CUDA the matmul writes fp32 itself
    (`out_dtype`, torch >= 2.8): one launch instead of two, the accumulator is not rounded to bf16, and on an H200 it
    is faster at every shape timed (2048 × 4096 × 24896: 543 against 704 µs; 1 × 4096 × 24896: 65 against 70 µs)."""
    if a.is_cuda and _FP32_OUT[0] and a.dim() in (2, 3):
        try:
            return (torch.mm if a.dim() == 2 else torch.bmm)(a, b, out_dtype=torch.float32)
        except torch.OutOfMemoryError:
            raise  # a RuntimeError too, but says nothing of this torch: the fallback stays for real absence only
        except (RuntimeError, TypeError):
            _FP32_OUT[0] = False
    return (a @ b).float()


Split = tuple[torch.Tensor, torch.Tensor | None]  # (hi, lo) bf16; lo None where the value is bf16 itself


def widened(t: torch.Tensor) -> torch.Tensor:
    """t in fp32 where it is kept narrower (bf16 values as a GPU load reads them), else as it is (fp32; a test's
    fp64): the operand of an fp32 product whatever the weight is kept in."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def split_bf16(x: torch.Tensor, bf16_values: bool = False) -> Split:
    """fp32 x as two bf16 tensors whose sum is x to ~2^-17 of its magnitude: hi = x rounded, lo = the rest rounded.
    `bf16_values`: x is known to hold bf16 values (latents read from a bf16 cache) - hi is x exactly, no lo."""
    hi = x.to(torch.bfloat16)
    if bf16_values:
        return hi, None
    rest = hi.float()
    torch.sub(x, rest, out=rest)  # x - hi in place: one fp32 temporary, not two
    return hi, rest.to(torch.bfloat16)


def split_bf16x3(x: torch.Tensor) -> torch.Tensor:
    """fp32 x as three bf16 parts [3, *x.shape] whose sum is x (to fp32's last bit or so): hi = x rounded, mid = the
    rest rounded, lo = what is left rounded. Against bf16 values every part's product is exact in fp32
    (engine/ops/triton_dsa.py `index_scores`, which makes the same parts inside the kernel where it takes fp32 q)."""
    parts = torch.empty(3, *x.shape, dtype=torch.bfloat16, device=x.device)
    parts[0] = x
    rest = x - parts[0].float()
    parts[1] = rest
    parts[2] = rest - parts[1].float()
    return parts


def split_product(a: torch.Tensor | Split, b: torch.Tensor | Split) -> torch.Tensor:
    """a @ b (2-D or batched 3-D) of fp32 operands on bf16 tensor cores at close to fp32 precision: each operand
    split in two (`split_bf16`, or given split), the three products that matter summed in fp32, smallest first
    (lo·hi + hi·lo, then hi·hi; lo·lo is below 2^-16 of the result and dropped; an operand without a lo part saves
    its product). Relative error ~4e-6 where one bf16 product errs by ~2e-3 (tests/engine/test_prompt_forms.py, on the
    CPU; ≤ 9e-6 a call in the served model's prompt attention on the H200). DSA's CUDA prompt attention runs on it
    (`SparseMLA._on_tensor_cores`) instead of fp32 products on the CUDA cores (docs/BENCHMARKS.md, session 16)."""
    a_hi, a_lo = split_bf16(a) if isinstance(a, torch.Tensor) else a
    b_hi, b_lo = split_bf16(b) if isinstance(b, torch.Tensor) else b
    parts = [(x, y) for x, y in ((a_lo, b_hi), (a_hi, b_lo)) if x is not None and y is not None] + [(a_hi, b_hi)]
    out = _wide_product(*parts[0])
    for x, y in parts[1:]:
        out += _wide_product(x, y)
    return out


def _wide_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 operands, fp32 sums and result (the CPU, or a torch whose GPU matmul cannot write fp32: in fp32
    throughout, where each bf16 product is exact; never a product rounded to bf16)."""
    if a.is_cuda and _FP32_OUT[0]:
        out = _fp32_product(a, b)
        if _FP32_OUT[0]:
            return out
    return a.float() @ b.float()


# Elementwise functions whose vectorised CPU kernels differ from their scalar tail (measured: sigmoid, silu,
# softplus on AVX512), so an element's bits would depend on its place in the tensor; composed here from functions
# that do not (exp, log1p and IEEE arithmetic). On CUDA every element runs the same code: torch's own.


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x) if x.is_cuda else 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x) if x.is_cuda else x / (1.0 + torch.exp(-x))


def softplus(x: torch.Tensor, threshold: float = 20.0) -> torch.Tensor:
    if x.is_cuda:
        return F.softplus(x, threshold=threshold)
    return torch.where(x > threshold, x, torch.log1p(torch.exp(x)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Over the last dim; on CUDA a few rows at a time go through `row_blocks` (torch's CUDA reductions split a row
    differently when there are few of them)."""
    if x.is_cuda and x.dim() >= 2 and x.shape[0] <= ROW_INVARIANT_ROWS:
        return row_blocks(lambda rows: _rms_norm(rows, weight, eps), x, kind="norm")
    return _rms_norm(x, weight, eps)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x if weight is None else x * weight


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    if x.is_cuda and x.dim() >= 2 and x.shape[0] <= ROW_INVARIANT_ROWS:
        return row_blocks(lambda rows: F.layer_norm(rows.float(), (x.shape[-1],), weight, bias, eps), x, kind="norm")
    return F.layer_norm(x.float(), (x.shape[-1],), weight, bias, eps)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # eps is added under the root (not clamped), as the KDA kernels define it
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def split_qkv(mixed: torch.Tensor, head_dim: int, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KDA's conv output [T, 3·W] as q, k, v [T, W / head_dim, head_dim] (views of it): q's and k's heads
    L2-normalised, q then scaled by head_dim^-1/2."""
    shape = (mixed.shape[0], mixed.shape[1] // (3 * head_dim), head_dim)
    q, k, v = (part.reshape(shape) for part in mixed.split(mixed.shape[1] // 3, dim=-1))
    return l2norm(q, eps) * head_dim**-0.5, l2norm(k, eps), v


def swiglu_clamped(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    """SwiGLU with GLM's limits: the gate is capped above, the up projection clamped both ways."""
    return silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)


def combine_pairs(
    pairs: torch.Tensor, order: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None = None
) -> torch.Tensor:
    """Expert outputs sorted by expert back to their tokens (`fused.combine_pairs`' contract): each row weighted in
    fp32, put back in (token, slot) order, a token's slots summed in order, base added."""
    tokens, top = weights.shape
    weighted = pairs.float() * weights.flatten()[order, None]
    back = torch.empty_like(weighted)
    back[order] = weighted
    by_slot = back.view(tokens, top, -1)
    out = by_slot[:, 0].clone()
    for slot in range(1, top):
        out += by_slot[:, slot]
    return out if base is None else base.float() + out


def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over one stream, kept token-major: out[t] = Σ_k weight[:, k] · seq[t + k] as K
    multiply-adds over shifted views of seq = [window ‖ x] ([K-1+T, C]), k in order, then SiLU.

    x: [T, C] new inputs; window: [C, K-1] the previous K-1 inputs (zeros at the start); weight: [C, K].
    Returns the outputs [T, C] and the new window.

    Not `F.conv1d` on the channel-major sequence: on the H200 torch's depthwise kernel took 0.52 ms a 2k chunk for a
    KDA layer's 12k channels, plus 0.4 ms for the transposing concatenation (docs/BENCHMARKS.md, session 16). The
    same sums, possibly in another order, so fp32 rounding apart.
    """
    kernel, t = weight.shape[1], x.shape[0]
    seq = torch.cat([window.t(), x])  # [K-1+T, C]
    out = seq[:t] * weight[:, 0]
    for k in range(1, kernel):
        out.addcmul_(seq[k : k + t], weight[:, k])
    return silu(out), conv_window(x, window)


def conv_window(x: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """The causal conv's next window: the last K-1 inputs of [window ‖ x] (x [T, C], window [C, K-1]), as [C, K-1]."""
    t, kept = x.shape[0], window.shape[1]
    if t >= kept:
        return x[t - kept :].t().contiguous()
    return torch.cat([window[:, t:], x.t()], dim=1)


def index_scores(
    q: torch.Tensor,
    keys: torch.Tensor | PoolKeys,
    head_w: torch.Tensor,
    positions: torch.Tensor,
    kpool: int,
    scale: float,
    alone: bool = False,
) -> torch.Tensor:
    """DSA's indexer: each query's score for every pool, Σ_h head_w[t, h] · relu(scale · q[t, h] · keys[p]), with the
    pools not complete at its position (pool p ends at p·kpool + kpool - 1) at fp32's lowest. q [T, h, d], keys
    [T or 1, P, d], head_w [T, h], positions [T] -> [T, P] fp32. `alone`: each score an elementwise product and sum of
    its own (a query's scores then do not depend on the other queries or the span: the CPU lane step). keys may be
    `PoolKeys` (gathered here)."""
    if isinstance(keys, PoolKeys):
        keys = keys.read()
    if alone:
        raw = (q[:, :, None, :] * keys[:, None, :, :]).sum(-1)  # [T, h, P], each score alone
        index = (head_w[:, :, None] * torch.relu(raw * scale)).sum(1)
    else:
        scores = torch.relu(torch.matmul(q, keys.transpose(-1, -2)) * scale)  # [T, h, P]
        index = torch.einsum("bh,bhp->bp", head_w, scores)
    return index.masked_fill(~visible_pools(keys.shape[-2], kpool, positions), torch.finfo(torch.float32).min)


@dataclass(frozen=True)
class PoolColumns:
    """Some columns of cache rows left where the cache pool holds them: `pool` (engine/cache.py KVPool), its pool
    layer `layer`, the `columns` of a row, and `slots` the rows' slots."""

    pool: Any
    layer: int
    columns: slice
    slots: torch.Tensor

    SPLIT_ROWS = 1 << 16  # rows read and split (or copied) at a time

    @property
    def width(self) -> int:
        return self.columns.stop - self.columns.start

    @property
    def shape(self) -> tuple[int, ...]:
        """What `read` gives: [*slots.shape, width]."""
        return (*self.slots.shape, self.width)

    @property
    def device(self) -> torch.device:
        return self.slots.device

    def read(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """The columns of `slots` (all of them by default) [..., width] fp32, as KVPool.read gives them."""
        return self.pool.read(self.layer, self.slots if slots is None else slots, columns=self.columns)

    def in_place(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What a kernel reads by slot: the pool layer's rows at these columns as stored (a strided view, every
        slot), and for fp8 rows the layer's scales by slot (else None)."""
        scales = None if self.pool.scales is None else self.pool.scales[self.layer]
        return self.pool.rows[self.layer][:, self.columns], scales

    def stored_bf16(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stored values of every slot as a bf16 copy [*slots.shape, width] — exactly those values for bf16 and
        e4m3 rows — and, for fp8 rows, their scales by slot (else None); copied SPLIT_ROWS rows at a time, with no
        gather of the stored rows of every slot first."""
        stored, scales = self.in_place()
        flat = self.slots.reshape(-1)
        values = torch.empty(flat.shape[0], self.width, dtype=torch.bfloat16, device=flat.device)
        for start in range(0, flat.shape[0], self.SPLIT_ROWS):
            part = slice(start, start + self.SPLIT_ROWS)
            values[part] = stored[flat[part]]
        return values.view(self.shape), None if scales is None else scales[self.slots]


@dataclass(frozen=True)
class PoolKeys(PoolColumns):
    """DSA pool keys: `slots` [T, P] the slot of each pool's last row a query, `columns` a row's key. `index_scores`
    reads them in place on CUDA; elsewhere `read` gathers them."""


@dataclass(frozen=True)
class PoolLatents(PoolColumns):
    """One stream's cached latents (a prompt chunk's DSA attention): `slots` [L] the slot of each position, `columns`
    a row's latent. Only what is used is read: `gather` the rows of some positions, `split` every row as the tensor
    cores take them, `by_row` for a kernel that reads rows by index — so no fp32 read of the span's whole rows is
    made (at a 1M-token span that was 3 GiB a layer); fp32 pools' latents, and fp8 ones where the kernel does not
    take e4m3, are held split (bf16 hi and lo, L × width × 4 bytes)."""

    # the longest span whose fp8 latents `by_row` hands over as a bf16 copy (256 MiB at the served rank of 512)
    COPY_ROWS = 1 << 18

    def gather(self, positions: torch.Tensor | slice) -> torch.Tensor:
        """The latents [..., r] fp32 of `positions` (KVPool.read: the values a read of the whole span holds there)."""
        return self.read(self.slots[positions])

    def by_row(
        self, tokens: torch.Tensor, fp8: bool = False, copy: bool = False
    ) -> tuple[Split, torch.Tensor, torch.Tensor | None]:
        """For a kernel that reads latent rows by index (`selected_attention`): the latents split, the row of each
        of `tokens` [T, N] (positions) in them, and for fp8 rows their scales by row. A bf16 pool's latents are its
        own rows in place (the latent columns of the pool layer, strided) and the rows are the tokens' slots: nothing
        gathered or converted; so are an fp8 pool's where the kernel takes fp8 rows (`fp8`), with the pool layer's
        row scales — or, asked to `copy` (the launch's "fp8_copy") and for spans up to COPY_ROWS, its stored e4m3
        values as a bf16 copy by position (exactly those values) with their scales. Other pools' are `split()`, by
        position."""
        if self.pool.kv == "fp8" and fp8 and copy and self.shape[0] <= self.COPY_ROWS:
            values, scales = self.stored_bf16()
            return (values, None), tokens, scales
        if self.pool.kv == "bf16" or (self.pool.kv == "fp8" and fp8):
            rows = self.slots[tokens.clamp(max=self.slots.shape[0] - 1)]  # past the span: padding, never read
            stored, scales = self.in_place()
            return (stored, None), rows, scales
        return self.split(), tokens, None

    def split(self) -> Split:
        """`split_bf16` of every position's latents, the same bits: a bf16 pool's are its stored values as they are
        (no lo part), an fp32 or fp8 pool's read and split a block of rows at a time."""
        if self.pool.kv == "bf16":
            return self.in_place()[0][self.slots], None
        length, width = self.shape
        hi = torch.empty(length, width, dtype=torch.bfloat16, device=self.slots.device)
        lo = torch.empty_like(hi)
        for start in range(0, length, self.SPLIT_ROWS):
            part = slice(start, start + self.SPLIT_ROWS)
            part_hi, part_lo = split_bf16(self.gather(part))
            assert part_lo is not None  # split in full: the values are not known to be bf16
            hi[part], lo[part] = part_hi, part_lo
        return hi, lo


def visible_pools(n_pools: int, kpool: int, positions: torch.Tensor) -> torch.Tensor:
    """[T, P] bool: whether pool p (its last token at p·kpool + kpool - 1) is complete at each query's position."""
    pool_end = torch.arange(n_pools, device=positions.device) * kpool + kpool - 1
    return pool_end[None, :] <= positions[:, None]


def top_pools(index: torch.Tensor, k: int) -> torch.Tensor:
    """The k best pools of each query [T, P] fp32 -> [T, k] int64 in position order: exactly the first k of a stable
    descending sort (a tie at the k-th score goes to the earlier pools), without sorting the span. The k-th best score
    comes from `topk` (a selection, not a sort: its order among ties is unspecified, so only its value is used), the
    pools above it are taken, then the earliest tied ones up to k; the j-th taken pool is where the running count of
    taken pools reaches j. Fixed shapes and no host reads (graphs hold it). Scores must not be NaN (a NaN row gets
    fewer than k pools above or tied, and its missing places hold the span's last pool)."""
    if k == 0:  # a span shorter than a pool
        return torch.empty(index.shape[0], 0, dtype=torch.int64, device=index.device)
    kth = index.topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    above, tied = index > kth, index == kth
    take = above | (tied & (tied.cumsum(-1, dtype=torch.int32) <= k - above.sum(-1, keepdim=True)))
    wanted = torch.arange(1, k + 1, dtype=torch.int32, device=index.device).expand(index.shape[0], k).contiguous()
    return torch.searchsorted(take.cumsum(-1, dtype=torch.int32), wanted).clamp_(max=index.shape[-1] - 1)


def pool_tokens(
    chosen: torch.Tensor | None,
    positions: torch.Tensor,
    kpool: int,
    pools: int,
    n_pools: int,
    tail_cap: int | None,
    table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens DSA's queries at `positions` [T] attend to, from the pools each chose: chosen [T, C] (C <= pools,
    position order; None: every pool of the span, C = n_pools) -> tokens [T, pools·kpool + kpool] int64 and whether
    each counts (bool, same shape). Column c < pools holds pool c's tokens (chosen[:, c] for c < C, else pool c,
    padding that never counts); a chosen pool's tokens count where the pool is complete at the query's position.
    The last kpool columns are the query's unfinished pool (the tail): they count up to the query's position and,
    with `tail_cap`, only while the query's complete pools (at most n_pools) are no more than tail_cap (the dense
    regime). `table` [T or 1, S] (slots by position): each token's slot table[·, min(token, S - 1)] instead of
    the token."""
    rows, dev = positions.shape[0], positions.device
    taken = min(n_pools, pools) if chosen is None else chosen.shape[1]
    all_pools = torch.arange(pools, device=dev).expand(rows, -1)
    if chosen is not None:
        all_pools = torch.cat([chosen, all_pools[:, taken:]], dim=1)
    within = torch.arange(kpool, device=dev)
    counts = (all_pools * kpool + kpool - 1 <= positions[:, None]) & (torch.arange(pools, device=dev) < taken)
    counts = counts[:, :, None].expand(-1, -1, kpool).flatten(1)
    tokens = (all_pools[:, :, None] * kpool + within).flatten(1)
    tail = ((positions + 1) - (positions + 1) % kpool)[:, None] + within
    tail_counts = tail <= positions[:, None]
    if tail_cap is not None:
        tail_counts &= (((positions + 1) // kpool).clamp(max=n_pools) <= tail_cap)[:, None]
    tokens, counts = torch.cat([tokens, tail], 1), torch.cat([counts, tail_counts], 1)
    if table is None:
        return tokens, counts
    return table.expand(rows, -1).gather(1, tokens.clamp(max=table.shape[1] - 1)), counts


def kda_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the delta rule for a batch of streams.

    state: [B, H, dk, dv]; q, k: [B, H, dk] (normalised, q pre-scaled); v: [B, H, dv]; g: [B, H, dk] log-decay;
    beta: [B, H]. Returns the output [B, H, dv] and the new state. A stream's bits do not depend on the others
    (`row_blocks`).
    """
    if state.is_cuda:  # the CUDA decode step runs engine/ops/triton_kda.py, one program per stream
        return _kda_step(state, q, k, v, g, beta)
    return row_blocks(_kda_step, state, q, k, v, g, beta)


def _kda_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    state = state * g.exp().unsqueeze(-1)
    remembered = torch.einsum("bhkv,bhk->bhv", state, k)
    delta = (v - remembered) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return torch.einsum("bhkv,bhk->bhv", state, q), state


def kda_chunked(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule over T tokens of one stream, a chunk at a time (same result as T calls of `kda_step`).

    state: [H, dk, dv]; q, k: [T, H, dk]; v: [T, H, dv]; g: [T, H, dk]; beta: [T, H].
    Inside a chunk with cumulative log-decay G, the corrections δ solve the unit lower-triangular system
    (I + A) δ = β (v - (k·e^G) S0) with A[t,s] = β_t Σ_i k_t,i k_s,i e^(G_t,i - G_s,i) for s < t; then
    o_t = (q_t·e^G_t) S0 + Σ_{s≤t} (Σ_i q_t,i k_s,i e^(G_t,i - G_s,i)) δ_s and S = e^G_last S0 + Σ_s (k_s e^(G_last - G_s)) δ_s.
    """
    outputs = []
    for start in range(0, q.shape[0], chunk):
        sl = slice(start, start + chunk)
        qc, kc, vc, bc = (x[sl].transpose(0, 1) for x in (q, k, v, beta))  # [H, C, ...]
        gc = g[sl].transpose(0, 1).cumsum(dim=1)  # [H, C, dk]
        n = qc.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        gap = gc.unsqueeze(2) - gc.unsqueeze(1)  # [H, C(t), C(s), dk]
        decay = gap.masked_fill(~causal[None, :, :, None], float("-inf")).exp()
        kk = torch.einsum("htk,hsk,htsk->hts", kc, kc, decay)
        a = (kk * bc.unsqueeze(-1)).masked_fill(~causal.tril(-1), 0.0)
        rhs = bc.unsqueeze(-1) * (vc - torch.einsum("htk,hkv->htv", kc * gc.exp(), state))
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        delta = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
        qk = torch.einsum("htk,hsk,htsk->hts", qc, kc, decay)
        out = torch.einsum("htk,hkv->htv", qc * gc.exp(), state) + qk @ delta
        last = gc[:, -1:, :]  # [H, 1, dk]
        state = last.transpose(1, 2).exp() * state + torch.einsum("hsk,hsv->hkv", kc * (last - gc).exp(), delta)
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs, dim=0), state


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb [T, n, n] (softmax + eps applied) -> doubly stochastic: columns, then rows and columns iters - 1 times."""
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return comb
