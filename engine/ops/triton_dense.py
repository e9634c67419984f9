"""Products with reduced-precision dense weights (engine/quant/dense.py: q4 codes with per-group fp16 scale and
offset, or e4m3 with per-row scales) for decode rows and verify windows, on the GPU.

One program computes a [16 rows, BLOCK_O outputs] tile over one slice of the inputs: it streams that slice of its
BLOCK_O outputs' stored weight once (input-major, the outputs contiguous: whole vectors per load), one group of
inputs at a time — the group's scales (and offsets) one row each, its weights made bf16 in registers (q·s + z, or
e4m3 · s, in fp32 then rounded) — and multiplies it with the rows' activations, rounded to bf16, on the tensor cores
(fp32 accumulation). (Measured slower on the H200: scaling each group's product instead of its weights, and q4
codes as the bf16 values 128 + q with the bias taken off after — the product no longer accumulates in place; no
faster: codes made fp32 by OR-ing them into 2^23's mantissa instead of converting them.) Rows go in fixed blocks of
16 (zero-padded), and the launch shape (BLOCK_O, BLOCK_K, the split of the inputs, warps) is chosen from the weight's
shape alone, so a row's bits never depend on how many rows share the call (drafted ≡ serial rests on it). With the
inputs split in S slices, the S partial tiles are summed by a second kernel in slice order (fixed, not atomics).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

ROW_BLOCK = 16  # rows per program: the smallest tensor-core tile
# Triton's CPU interpreter multiplies bf16 operands wrongly (their raw bits); there the products take fp16 operands
# and are summed elementwise (the interpreter's tl.dot is numpy's matmul, whose BLAS may sum a row by its place in
# the tile), so the CPU tests check the kernel's indexing, splits and row handling, and tests/gpu its bf16 numbers
# and the tensor cores' row invariance
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
NUM_STAGES = 3


@triton.jit
def _operand(x, FP16: tl.constexpr):
    """A tensor-core operand: bf16 (fp16 under the interpreter, see INTERPRETED)."""
    if FP16:
        return x.to(tl.float16)
    return x.to(tl.bfloat16)


@triton.jit
def _mma(a, b, FP16: tl.constexpr):
    """a [16, k] times b [k, n], fp32: on the tensor cores, or (interpreted, see INTERPRETED) as a plain sum."""
    if FP16:
        return tl.sum(a[:, :, None].to(tl.float32) * b[None, :, :].to(tl.float32), axis=1)
    return tl.dot(a, b)


@triton.jit
def _dense_rows(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    N,
    OUT,
    stride_x,
    stride_w,
    stride_s,
    K: tl.constexpr,
    K_PER_SPLIT: tl.constexpr,
    FP8: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP16: tl.constexpr,
):
    pid_o = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * 16 + tl.arange(0, 16)
    outs = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    row_ok = rows < N
    out_ok = outs < OUT
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x
    acc = tl.zeros((16, BLOCK_O), dtype=tl.float32)
    k_start = split * K_PER_SPLIT
    for step in range(0, K_PER_SPLIT, BLOCK_K):
        for sub in tl.static_range(BLOCK_K // GROUP):  # one group of inputs: one row of scales (and offsets)
            k0 = k_start + step + sub * GROUP
            g_ok = k0 < K
            s = tl.load(s_ptr + (k0 // GROUP) * stride_s + outs, mask=out_ok & g_ok, other=0.0).to(tl.float32)
            if FP8:
                kk = k0 + tl.arange(0, GROUP)
                k_ok = kk < K
                x = tl.load(x_rows + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(
                    w_ptr + kk[:, None].to(tl.int64) * stride_w + outs[None, :],
                    mask=k_ok[:, None] & out_ok[None, :],
                    other=0.0,
                )
                acc += _mma(_operand(x, FP16), _operand(w.to(tl.float32) * s[None, :], FP16), FP16)
            else:
                z = tl.load(z_ptr + (k0 // GROUP) * stride_s + outs, mask=out_ok & g_ok, other=0.0).to(tl.float32)
                half = tl.arange(0, GROUP // 2)
                even = k0 + 2 * half  # inputs 2j (low nibbles); 2j + 1 are the high ones
                x_ok = row_ok[:, None] & g_ok
                xe = _operand(tl.load(x_rows + even[None, :], mask=x_ok, other=0.0), FP16)
                xo = _operand(tl.load(x_rows + even[None, :] + 1, mask=x_ok, other=0.0), FP16)
                codes = tl.load(  # [GROUP/2, BLOCK_O] bytes, the outputs contiguous
                    w_ptr + (k0 // 2 + half)[:, None].to(tl.int64) * stride_w + outs[None, :],
                    mask=out_ok[None, :] & g_ok,
                    other=0,
                )
                acc += _mma(xe, _operand((codes & 15).to(tl.float32) * s[None, :] + z[None, :], FP16), FP16)
                acc += _mma(xo, _operand((codes >> 4).to(tl.float32) * s[None, :] + z[None, :], FP16), FP16)
    dest = out_ptr + split.to(tl.int64) * N * OUT + rows[:, None].to(tl.int64) * OUT + outs[None, :]
    tl.store(dest, acc, mask=row_ok[:, None] & out_ok[None, :])


@triton.jit
def _sum_splits(part_ptr, out_ptr, total, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    acc = tl.load(part_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(part_ptr + s * total + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, acc, mask=ok)


@functools.cache
def launch_shape(out_features: int, in_features: int, fp8: bool, group: int) -> dict[str, int]:
    """block_o, block_k, splits, num_warps, num_stages for a weight's shape — never for the row count (each distinct
    shape once: the table is cached). From a sweep on the H200
    (bench/dense_bench.py --sweep, docs/BENCHMARKS.md): tall weights (many outputs) best in 256-output blocks, one
    group a step; wide ones in 128-output blocks, two groups a step; the inputs split in 4 at these widths."""
    tall = out_features >= 16384
    block_o = 256 if tall else 128
    block_k = group if tall or in_features % (2 * group) else 2 * group
    splits = 1
    while splits < 4 and in_features // (splits * 2) >= 2 * block_k:
        splits *= 2
    warps = 8 if not fp8 and block_k > group else 4
    return dict(block_o=block_o, block_k=block_k, splits=splits, num_warps=warps, num_stages=NUM_STAGES)


def dense_rows(x: torch.Tensor, weight, tuning: dict | None = None) -> torch.Tensor:
    """x [N, K] (any float type) times a QuantWeight [O, K] -> fp32 [N, O]. `tuning` (bench/dense_bench.py --sweep
    only) overrides the launch: block_o, block_k, splits, num_warps, num_stages."""
    x = x.contiguous()
    n, k = x.shape
    o = weight.shape[0]
    fp8 = weight.mode == "fp8"
    launch = launch_shape(o, k, fp8, weight.group)
    if tuning:
        launch = {**launch, **tuning}
    block_o, block_k, splits = launch["block_o"], launch["block_k"], launch["splits"]
    per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    out = torch.empty((splits, n, o), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(o, block_o), triton.cdiv(n, ROW_BLOCK), splits)
    _dense_rows[grid](
        x,
        weight.data,
        weight.scale,
        weight.scale if fp8 else weight.offset,
        out,
        n,
        o,
        x.stride(0),
        weight.data.stride(0),
        weight.scale.stride(0),
        K=k,
        K_PER_SPLIT=per_split,
        FP8=fp8,
        GROUP=weight.group,
        BLOCK_O=block_o,
        BLOCK_K=block_k,
        FP16=INTERPRETED,
        num_warps=launch["num_warps"],
        num_stages=launch["num_stages"],
    )
    if splits == 1:
        return out[0]
    summed = torch.empty((n, o), dtype=torch.float32, device=x.device)
    total = n * o
    _sum_splits[(triton.cdiv(total, 1024),)](out, summed, total, SPLITS=splits, BLOCK=1024)
    return summed
