"""fp32 products of a few rows (decode steps, verify windows) that are row-invariant by construction, on the GPU.

A step that may verify drafts must give a row the same bits whatever shares the step (engine/ops/reference.py
`row_blocks`). cuBLAS picks its kernel by the row count, so `row_blocks` runs such products at a fixed 16 rows:
for fp32 weights (the MoE routers, DSA's absorbed kv_b) that is a CUDA-core GEMM about twice as slow as the
one-row GEMV, behind a zero fill and a concatenation (measured at the released depth on the H200,
docs/BENCHMARKS.md, session 17). Here each (row, block of outputs) is one program running the same code whatever
the row count: it reads its outputs' weights once, in BLOCK_K-wide slices, keeps a [BLOCK_O, BLOCK_K] fp32
accumulator of products, and sums it along the inputs at the end in the one order the launch shape fixes. The launch
shape comes from the weight's shape alone, so a row's bits never depend on the batch, and nothing is padded.

`rows_product(x [N, P, K], w [P, O, K])` covers both uses: one weight (P = 1, `fused.linear` with an fp32 weight:
the routers) and P weights applied head by head (DSA's `bhd,hdr` and `bhr,hvr` products, `fused.head_products`); w
may be any strided view (w_k is read through its transpose) and fp32 or bf16 (kv_b as a GPU load keeps it: each
value exact in its fp32 product; the layout, and so the order of the sums, follows the element size).

`rms_norm_rows` is the RMS norm of a step's rows the same way: a program a row, the row's sum of squares in one
fixed order, one launch where torch takes six behind a padding copy (`row_blocks` "norm").
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

TILE = 8192  # accumulator values a program holds (64 a thread at 4 warps)
PROGRAMS = 256  # programs a single row should give at least, where the weight allows (132 SMs on an H200)


@triton.jit
def _rows_product(
    x_ptr,
    w_ptr,
    out_ptr,
    stride_xn,
    stride_xp,
    stride_wp,
    stride_wo,
    stride_wk,
    stride_on,
    stride_op,
    OUT,
    K: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    pair = tl.program_id(2).to(tl.int64)
    outs = block * BLOCK_O + tl.arange(0, BLOCK_O)
    out_ok = outs < OUT
    x_row = x_ptr + row * stride_xn + pair * stride_xp
    w_rows = w_ptr + pair * stride_wp + outs.to(tl.int64)[:, None] * stride_wo
    acc = tl.zeros([BLOCK_O, BLOCK_K], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_row + ks, mask=k_ok, other=0.0)
        w = tl.load(w_rows + ks[None, :].to(tl.int64) * stride_wk, mask=out_ok[:, None] & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    tl.store(out_ptr + row * stride_on + pair * stride_op + outs, tl.sum(acc, axis=1), mask=out_ok)


@functools.cache
def launch_shape(pairs: int, out_features: int, in_features: int) -> tuple[int, int]:
    """(BLOCK_O, BLOCK_K) from the weight's shape alone: the inputs in as few slices as TILE allows (their loads in
    flight together), then the largest output block that still gives one row PROGRAMS programs."""
    block_k = min(triton.next_power_of_2(in_features), TILE)
    block_o = TILE // block_k
    while block_o > 1 and pairs * triton.cdiv(out_features, block_o) < PROGRAMS:
        block_o //= 2
    return block_o, block_k


def fits(pairs: int, out_features: int, in_features: int) -> bool:
    """Whether a weight of this shape fits the launch grid: its output blocks go on an axis of at most 65,535."""
    return pairs <= 65535 and triton.cdiv(out_features, launch_shape(pairs, out_features, in_features)[0]) <= 65535


def rows_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, P, K] (fp32; the innermost stride 1) times w [P, O, K] (any float dtype, any strides) -> fp32 [N, P, O]:
    out[n, p] = w[p] @ x[n, p], each row computed alone."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows, pairs, k = x.shape
    _, o, _ = w.shape
    out = torch.empty(rows, pairs, o, dtype=torch.float32, device=x.device)
    block_o, block_k = launch_shape(pairs, o, k)
    _rows_product[(rows, triton.cdiv(o, block_o), pairs)](
        x,
        w,
        out,
        x.stride(0),
        x.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(0),
        out.stride(1),
        o,
        K=k,
        BLOCK_O=block_o,
        BLOCK_K=block_k,
    )
    return out


@triton.jit
def _rms_norm_rows(
    x_ptr, w_ptr, out_ptr, stride_x, eps, WIDTH: tl.constexpr, BLOCK: tl.constexpr, WEIGHT: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    live = offs < WIDTH
    x = tl.load(x_ptr + row * stride_x + offs, mask=live, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / WIDTH + eps)
    if WEIGHT:
        y = y * tl.load(w_ptr + offs, mask=live, other=0.0)
    tl.store(out_ptr + row * WIDTH + offs, y, mask=live)


NORM_WIDTH = 16384  # widest row `rms_norm_rows` takes (one block a program)


def rms_norm_rows(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x [N, W] (rows may be strided; W <= NORM_WIDTH) -> fp32 x · rsqrt(mean(x²) + eps) (· weight, fp32 [W]), as
    reference.rms_norm (fp32 rounding apart: the sum runs in another order), each row alone."""
    rows, width = x.shape
    out = torch.empty(rows, width, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(width)
    _rms_norm_rows[(rows,)](
        x, out if weight is None else weight, out, x.stride(0), float(eps), WIDTH=width, BLOCK=block,
        WEIGHT=weight is not None, num_warps=4 if block >= 2048 else 1,
    )  # fmt: skip
    return out
