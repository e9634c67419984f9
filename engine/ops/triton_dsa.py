"""DSA's attention for a decode step's rows (engine/models/glm5_next/dsa.py `_attend_lanes`) on the GPU: each row's
heads over the latents of its selected tokens, in two launches whatever the rows.

In torch a row is a batched matmul, a masked softmax and a second batched matmul (about a dozen launches with cuBLAS's
split-K reductions), run a row at a time where a verify step may come (`row_blocks` "dsa_attend": a row's bits must
not depend on the others); a verify window of four rows in four lanes made that 16 times a layer. Here, as in
flash-decoding:

- `_attend_part`, a program per (row, block of BLOCK selected tokens): the block's latents read in 64-wide slices of
  the rank (a loop the compiler pipelines) for the scores of every head (q_abs · latentᵀ · scaling, tokens that do
  not count at -inf), the block's max and sum of exp per head, then the block's share of the context,
  exp(score − max) · latents, the slices read again (tokens that do not count are not read at all: no bytes spent on
  them at a short context, and a stale row cannot poison the sum);
- `_attend_combine`, a program per (row, head): the blocks' shares rescaled to the row's max and summed over the
  blocks in one fixed order (a tree over every block's slice at once), divided by the row's sum.

Products run on the tensor cores as `tf32x3` (each fp32 operand split into a TF32 part and its remainder, three TF32
products: fp32's accuracy; with one fp32 FMA a multiply a program took ~8 µs at these sizes, by its instruction
count), so the result agrees with the torch form to fp32 rounding (the softmax is also taken in blocks); the launch
shape depends on the row count only through the grid's first axis and every program's work on its own row, so a
row's bits are its own alone or beside others.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 32  # selected tokens a program (65 programs a row for the served 2,052)
SLICE = 64  # rank columns a product step


@triton.jit
def _attend_part(
    q_ptr,
    lat_ptr,
    cnt_ptr,
    part_ptr,
    stat_ptr,
    scaling,
    N,
    BLOCKS: tl.constexpr,
    H: tl.constexpr,
    HP: tl.constexpr,
    R: tl.constexpr,
    BN: tl.constexpr,
    RC: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    toks = blk * BN + tl.arange(0, BN)
    live = toks < N
    counted = (tl.load(cnt_ptr + row * N + toks, mask=live, other=0) != 0) & live
    heads = tl.arange(0, HP)
    head_ok = heads < H
    cols = tl.arange(0, RC)
    q_rows = q_ptr + row * H * R + heads[:, None] * R + cols[None, :]
    lat_rows = lat_ptr + row * N * R + toks[:, None].to(tl.int64) * R + cols[None, :]
    scores = tl.zeros([HP, BN], dtype=tl.float32)
    for r0 in range(0, R, RC):  # a loop the compiler pipelines: the next slice's loads fly during this product
        q = tl.load(q_rows + r0, mask=head_ok[:, None], other=0.0)
        lat = tl.load(lat_rows + r0, mask=counted[:, None], other=0.0)  # only what counts is read
        scores = tl.dot(q, tl.trans(lat), scores, input_precision="tf32x3")
    scores = tl.where(counted[None, :], scores * scaling, float("-inf"))
    top = tl.max(scores, axis=1)  # [HP]: -inf where no token of the block counts
    shift = tl.where(top == float("-inf"), 0.0, top)
    p = tl.exp(scores - shift[:, None])
    part = row * BLOCKS + blk
    tl.store(stat_ptr + part * 2 * HP + heads, top)
    tl.store(stat_ptr + part * 2 * HP + HP + heads, tl.sum(p, axis=1))
    out_rows = part_ptr + (part * HP + heads[:, None]) * R + cols[None, :]
    for r0 in range(0, R, RC):
        lat = tl.load(lat_rows + r0, mask=counted[:, None], other=0.0)
        tl.store(out_rows + r0, tl.dot(p, lat, input_precision="tf32x3"))


@triton.jit
def _attend_combine(
    part_ptr,
    stat_ptr,
    out_ptr,
    BLOCKS: tl.constexpr,
    H: tl.constexpr,
    HP: tl.constexpr,
    R: tl.constexpr,
    BP: tl.constexpr,
    RC: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    blocks = tl.arange(0, BP)
    ok = blocks < BLOCKS
    stats = stat_ptr + (row * BLOCKS + blocks) * 2 * HP + head
    top = tl.load(stats, mask=ok, other=float("-inf"))
    best = tl.max(top, axis=0)
    weight = tl.where(top == float("-inf"), 0.0, tl.exp(top - best))
    total = tl.sum(weight * tl.load(stats + HP, mask=ok, other=0.0), axis=0)
    cols = tl.arange(0, RC)
    parts = part_ptr + ((row * BLOCKS + blocks[:, None]) * HP + head) * R + cols[None, :]
    for r0 in tl.static_range(0, R, RC):  # every block's slice at once, summed over the blocks in one fixed tree
        share = tl.load(parts + r0, mask=ok[:, None], other=0.0)
        tl.store(out_ptr + (row * H + head) * R + r0 + cols, tl.sum(weight[:, None] * share, axis=0) / total)


def lane_attention(q_abs: torch.Tensor, latents: torch.Tensor, counts: torch.Tensor, scaling: float) -> torch.Tensor:
    """softmax(q_abs · latentsᵀ · scaling, over the tokens that count) · latents per row and head: q_abs [B, H, R],
    latents [B, N, R] fp32, counts [B, N] bool -> [B, H, R] fp32 (dsa.py `_attend_rows`). Every row must have a
    token that counts (a query always sees itself). The blocks' shares are held for the combine: rows × blocks × heads
    × R fp32 (64 rows, 32 heads: 272 MB, in a graph's pool)."""
    rows, heads, rank = q_abs.shape
    n = latents.shape[1]
    q_abs, latents = q_abs.float().contiguous(), latents.float().contiguous()
    hp = max(16, triton.next_power_of_2(heads))
    blocks = triton.cdiv(n, BLOCK)
    part = torch.empty(rows, blocks, hp, rank, dtype=torch.float32, device=q_abs.device)
    stat = torch.empty(rows, blocks, 2, hp, dtype=torch.float32, device=q_abs.device)
    _attend_part[(rows, blocks)](
        q_abs, latents, counts.contiguous().view(torch.uint8), part, stat, float(scaling), n, BLOCKS=blocks,
        H=heads, HP=hp, R=rank, BN=BLOCK, RC=min(SLICE, rank), num_warps=4, num_stages=3,
    )  # fmt: skip
    out = torch.empty(rows, heads, rank, dtype=torch.float32, device=q_abs.device)
    _attend_combine[(rows, heads)](
        part, stat, out, BLOCKS=blocks, H=heads, HP=hp, R=rank, BP=triton.next_power_of_2(blocks),
        RC=min(SLICE, rank), num_warps=8,
    )  # fmt: skip
    return out
