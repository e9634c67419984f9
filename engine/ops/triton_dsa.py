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

A prompt chunk's queries (`selected_attention`, `_attend_prompt`) take another shape: thousands of queries, each with
its own 2,052 selected tokens, so a program per query walks its tokens in blocks with an online softmax, and no
query's latents are ever gathered into memory. All the query's heads share the latents (MLA's absorbed form), so the
products are laid out token-major — scoresᵀ [tokens, heads] = latents · q_absᵀ and contextᵀ [rank, heads] +=
latentsᵀ · p — with the block's tokens (then the rank) as the tensor-core tile's tall side and the heads as its
narrow one; each latent block is read once, from L2 or HBM, for both products. Operands are the split bf16 pairs of
the torch form (`reference.split_product`: q_abs and p as hi + lo against bf16 latents, plus the latents' lo part
for an fp32 cache), so the result agrees with it to fp32 rounding. An fp8 cache's latents are e4m3 values, bf16
exactly, with a scale a row on the row's scores and weights: under the H200's launch a bf16 copy of them for spans up
to `PoolLatents.COPY_ROWS` (converted here, they take 2.1x the instructions a block of 64), else the e4m3 rows in
place. A block's latent offsets are 32-bit unless the latents may pass 2^31 values (`WIDE`): with 64-bit ones the
[tokens × rank] address tile spilled (sm_90: 2,098 loop instructions and 106 local accesses a block, against 1,919 and
61), and the kernel took 10.5 against 5.8 ms for a 2k chunk's 64 heads at 8k (traces on two H100 machines;
docs/BENCHMARKS.md, session 35).

DSA's indexer (`index_scores`, `_index_scores`) scores every pool for a query — Σ_h w_h · relu(q_h · key) — for prompt
chunks and decode steps alike: a program per (block of pools, block of queries), each query's [heads × pools] product
alone on the tensor cores with the relu, the weighted sum over the heads and the mask of pools not yet complete in
registers. The torch form wrote a [T, heads, P] fp32 tensor (0.5 GB for a 2k chunk at 32k) and read it back three
times; a query's scores now have the same bits whichever form of step computes them. The keys (`PoolKeys`) are read
where the cache pool holds them — each pool's key in its last row's key columns, by slot — rather than gathered into
an fp32 copy first. Keys stored as bf16 or e4m3 are bf16 values exactly, so the products take them as they are
against q in three bf16 parts whose sum is q (each partial product exact in fp32, an fp8 row's scale on the
product): half the tensor-core instructions of tf32x3 (which fp32 keys still take) and no split of the keys; a
prompt chunk's q parts are made once for the launch (split in every program, they cost more than the products
saved; bench/dsa_sass.py).

DSA's pool keys (`complete_pools`, `_pool_key_rows`): after a step's or a prompt chunk's cache rows are written, a
program a row makes the key of the pool the row completes (if it does) from its tokens' rows as the pool holds them
and writes it into the row's key columns — the whole row again with fp8 rows, under a scale that covers the key —:
one launch a layer where the torch form took about twenty.

DSA's pool choice (`top_pools`: a radix select, by segments of a query's span, or one program a query in one launch,
`_pool_select`) and the selected tokens from it (`pool_tokens`, `_pool_tokens`: the chosen pools' tokens, padding,
the unfinished pool's tail and whether each counts, the slots by a step's table: one launch where the torch form
took about twenty).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from engine.ops import reference
from engine.ops.reference import PoolKeys
from engine.ops.triton_dense import _round_bf16

BLOCK = 32  # selected tokens a program (65 programs a row for the served 2,052)
SLICE = 64  # rank columns a product step
# the prompt kernel's launch (selected tokens a step, heads a program - more go to further programs -, warps,
# stages, whether the heads are the products' tall side) by GPU and latents. On Hopper: the fastest measured on the
# H200 (docs/BENCHMARKS.md, session 21; a 2,048-query chunk at TP=2's 32 heads, 8k context: from a bf16 cache 3.5 ms,
# 205 KB of shared memory a block, against 4.2-12.7 for the other launches timed; with a lo part - an fp32 cache: two
# latent tiles a step - 9.2 ms in one stage, 205 KB, against 10.3-27.4), the tokens the tall side (the warpgroup MMA's
# 64 rows). Elsewhere (a GB10: mma.sync's 16-row tiles) the heads are the tall side: with the tokens there, a block of
# 16 put every warp on the same 16 rows, so warps repeated each other's products, and the weights went through shared
# memory to be the context product's operand. Compiled for sm_89 (the GB10's mma.sync code's stand-in;
# bench/dsa_sass.py, session 42) the loop issues 14.2 instructions a (token, head) from a bf16 pool where it issued
# 36.5, 15.9 from an fp8 pool in place where 37.4, a third of the MMAs, none spilled; a lo part takes 16 heads a
# program, 24.1 where 57.0, to stay within 101,376 B, the GB10's shared memory a block
# (tests/engine/test_gb10_compile.py). Not timed on a GB10 (an H100's mma.sync, session 42: 6.61 -> 5.77 ms). With "fp8_copy", an fp8 pool's latents go to the kernel as a bf16 copy (`PoolLatents.by_row`):
# in the H200's launch e4m3 converted in the kernel took 2.1x its instructions a block of 64 and 6x its spill
# traffic; in the GB10's about as many as a copy's, which would only add its traffic
PROMPT_LAUNCHES = {
    "sm90": {"block": 64, "heads": 32, "num_warps": 4, "num_stages": 2, "fp8_copy": True, "heads_m": False},
    "sm90_lo": {"block": 64, "heads": 32, "num_warps": 8, "num_stages": 1, "fp8_copy": False, "heads_m": False},
    "other": {"block": 16, "heads": 32, "num_warps": 4, "num_stages": 1, "fp8_copy": False, "heads_m": True},
    "other_lo": {"block": 16, "heads": 16, "num_warps": 4, "num_stages": 1, "fp8_copy": False, "heads_m": True},
}
# Triton's interpreter multiplies bf16 operands as their raw bits (Triton 3.6): there the prompt kernel widens them
# to fp32 first, the same exact products and fp32 sums; the compiled kernel multiplies bf16 on the tensor cores
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# `_attend_part` compiled without FMA contraction: an fp8 row's value × scale is rounded before the tf32x3 product
# splits it, as KVPool.read's is (contracted into the split's remainder it gave other bits than the gathered copy's:
# 80 fma.rn.f32 in the sm_90 PTX, none without; tests/gpu/test_rows_gpu.py, session 32)
LANE_FP_FUSION = False


@triton.jit
def _lane_latents(lat_rows, counted, row_scale, FP8: tl.constexpr):
    """A block's latent slice as fp32, only what counts read: the values KVPool.read gives (a stored bf16 value
    widened, an e4m3 one widened and times its row's scale: the same one fp32 rounding)."""
    lat = tl.load(lat_rows, mask=counted[:, None], other=0.0).to(tl.float32)
    if FP8:
        lat = lat * row_scale[:, None]
    return lat


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
    slot_ptr,  # GATHER: each token's slot [B, N]; lat_ptr a cache pool layer's latent columns (rows of row_stride)
    scl_ptr,  # FP8: the pool layer's row scales by slot
    row_stride,
    GATHER: tl.constexpr,
    FP8: tl.constexpr,
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
    if GATHER:  # the latents where the cache pool holds them, by slot
        slots = tl.load(slot_ptr + row * N + toks, mask=counted, other=0)
        lat_rows = lat_ptr + slots[:, None] * row_stride + cols[None, :]
    else:
        slots = toks
        lat_rows = lat_ptr + row * N * R + toks[:, None].to(tl.int64) * R + cols[None, :]
    if FP8:
        row_scale = tl.load(scl_ptr + slots, mask=counted, other=1.0)
    else:
        row_scale = tl.full([BN], 1.0, tl.float32)
    scores = tl.zeros([HP, BN], dtype=tl.float32)
    for r0 in range(0, R, RC):  # a loop the compiler pipelines: the next slice's loads fly during this product
        q = tl.load(q_rows + r0, mask=head_ok[:, None], other=0.0)
        lat = _lane_latents(lat_rows + r0, counted, row_scale, FP8)  # only what counts is read
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
        lat = _lane_latents(lat_rows + r0, counted, row_scale, FP8)
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


def lane_attention(
    q_abs: torch.Tensor, latents: torch.Tensor | reference.PoolColumns, counts: torch.Tensor, scaling: float
) -> torch.Tensor:
    """softmax(q_abs · latentsᵀ · scaling, over the tokens that count) · latents per row and head: q_abs [B, H, R],
    latents [B, N, R] fp32 — or left in the cache pool (`PoolColumns`, slots [B, N]: read there by slot, the values
    KVPool.read gives, so the same bits without a gathered fp32 copy written and read back) —, counts [B, N] bool ->
    [B, H, R] fp32 (dsa.py `_attend_rows`). Every row must have a token that counts (a query always sees itself).
    The blocks' shares are held for the combine: rows × blocks × heads × R fp32 (64 rows, 32 heads: 272 MB, in a
    graph's pool). Compiled without FMA contraction (LANE_FP_FUSION)."""
    rows, heads, rank = q_abs.shape
    n = latents.shape[1]
    q_abs = q_abs.float().contiguous()
    hp = max(16, triton.next_power_of_2(heads))
    blocks = triton.cdiv(n, BLOCK)
    part = torch.empty(rows, blocks, hp, rank, dtype=torch.float32, device=q_abs.device)
    stat = torch.empty(rows, blocks, 2, hp, dtype=torch.float32, device=q_abs.device)
    if isinstance(latents, reference.PoolColumns):
        source, scales = latents.in_place()
        slots, stride = latents.slots.contiguous(), source.stride(0)
    else:
        source, slots, scales, stride = latents.float().contiguous(), None, None, 0
    _attend_part[(rows, blocks)](
        q_abs, source, counts.contiguous().view(torch.uint8), part, stat, float(scaling), n, BLOCKS=blocks,
        H=heads, HP=hp, R=rank, BN=BLOCK, RC=min(SLICE, rank), slot_ptr=slots if slots is not None else stat,
        scl_ptr=scales if scales is not None else stat, row_stride=stride, GATHER=slots is not None,
        FP8=scales is not None, num_warps=4, num_stages=3, enable_fp_fusion=LANE_FP_FUSION,
    )  # fmt: skip
    out = torch.empty(rows, heads, rank, dtype=torch.float32, device=q_abs.device)
    _attend_combine[(rows, heads)](
        part, stat, out, BLOCKS=blocks, H=heads, HP=hp, R=rank, BP=triton.next_power_of_2(blocks),
        RC=min(SLICE, rank), num_warps=8,
    )  # fmt: skip
    return out


@triton.jit
def _operand(x, WIDEN: tl.constexpr):
    if WIDEN:
        return x.to(tl.float32)
    return x


@triton.jit
def _attend_block(
    tok_ptr, cnt_ptr, hi_ptr, lo_ptr, scl_ptr, query, n0, cols, lat_stride,
    N: tl.constexpr, BT: tl.constexpr, HAS_LO: tl.constexpr, WIDEN: tl.constexpr, FP8: tl.constexpr,
    WIDE: tl.constexpr,
):  # fmt: skip
    """A block of BT of a query's selected tokens: which count, their latents [BT, R] (only what counts read; the lo
    part, or the hi part again where there is none) and, FP8, each row's scale [BT] (else a 1)."""
    toks = n0 + tl.arange(0, BT)
    live = toks < N
    counted = (tl.load(cnt_ptr + query * N + toks, mask=live, other=0) != 0) & live
    rows = tl.load(tok_ptr + query * N + toks, mask=counted, other=0).to(tl.int64 if WIDE else tl.int32)
    at = rows[:, None] * lat_stride + cols[None, :]
    lat = tl.load(hi_ptr + at, mask=counted[:, None], other=0.0)
    if FP8:  # an e4m3 value is a bf16 value exactly: no lo part; its row's scale goes on the products
        if hi_ptr.dtype.element_ty == tl.float8e4nv:  # else a bf16 copy of the stored values
            lat = lat.to(tl.float32).to(tl.bfloat16)
        row_scale = tl.load(scl_ptr + rows, mask=counted, other=1.0)
    else:
        row_scale = 1.0
    lat = _operand(lat, WIDEN)
    lat_lo = lat
    if HAS_LO:
        lat_lo = _operand(tl.load(lo_ptr + at, mask=counted[:, None], other=0.0), WIDEN)
    return counted, lat, lat_lo, row_scale


@triton.jit
def _attend_weights(scores, counted, row_scale, top, total, FP8: tl.constexpr, WIDEN: tl.constexpr, AXIS: tl.constexpr):
    """The online softmax over a block: scores with the tokens along AXIS (0: [BT, HG], 1: [HG, BT]) -> the block's
    weights as two bf16 parts (hi, the rest rounded; FP8: times each row's scale), the factor the sums so far take,
    and the new running maximum and total."""
    if FP8:
        scores = scores * tl.expand_dims(row_scale, 1 - AXIS)
    scores = tl.where(tl.expand_dims(counted, 1 - AXIS), scores, float("-inf"))
    new_top = tl.maximum(top, tl.max(scores, axis=AXIS))
    shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # no token counted yet: nothing to rescale
    p = tl.exp(scores - tl.expand_dims(shift, AXIS))
    scale = tl.exp(top - shift)
    total = total * scale + tl.sum(p, axis=AXIS)
    if FP8:  # Σ p · (scale · value): the scale taken into the weights
        p = p * tl.expand_dims(row_scale, 1 - AXIS)
    p_hi = p.to(tl.bfloat16)
    p_lo = _operand((p - p_hi.to(tl.float32)).to(tl.bfloat16), WIDEN)
    return _operand(p_hi, WIDEN), p_lo, scale, new_top, total


@triton.jit
def _attend_prompt(
    qh_ptr,
    ql_ptr,
    hi_ptr,
    lo_ptr,
    tok_ptr,
    cnt_ptr,
    out_ptr,  # the context [H, T, R]: fp32, or (SPLIT_OUT) its bf16 hi part, the lo part at lo_out_ptr
    lo_out_ptr,
    T,
    N: tl.constexpr,  # fixed by the config (index_topk + a pool), so one compile; a loop bound the interpreter takes
    H: tl.constexpr,
    HG: tl.constexpr,
    R: tl.constexpr,
    BT: tl.constexpr,
    HAS_LO: tl.constexpr,
    WIDEN: tl.constexpr,
    lat_stride,  # a latent row's stride: R, or a cache pool layer's row width (its latents read in place)
    scl_ptr,  # FP8: each row's scale (a cache pool layer's, by the same row index)
    FP8: tl.constexpr,  # the latents are fp8 cache rows' values (e4m3 in place, or a bf16 copy) × a row's scale
    WIDE: tl.constexpr,  # a latent's offset may pass 2^31 values: 64-bit offsets (else 32-bit: fewer registers)
    SPLIT_OUT: tl.constexpr,  # the context written split (`reference.split_bf16`'s hi and lo of the fp32 values)
    HEADS_M: tl.constexpr = False,  # the heads as the products' tall side: scoresᵀ [HG, BT], contextᵀ [HG, R]
):
    query = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HG + tl.arange(0, HG)
    head_ok = heads < H
    cols = tl.arange(0, R)
    top = tl.full([HG], float("-inf"), tl.float32)
    total = tl.zeros([HG], dtype=tl.float32)
    if HEADS_M:
        # mma.sync's tiles (a GB10): the tokens' side is the products' short one, so no warp repeats another's
        # products, and the weights are the context product's register operand as they come (no shared memory)
        q_at = (heads[:, None] * T + query) * R + cols[None, :]  # [HG, R]: q_abs, and where the context goes
        head_mask = head_ok[:, None]
        ctx = tl.zeros([HG, R], dtype=tl.float32)
    else:
        q_at = (heads[None, :] * T + query) * R + cols[:, None]  # [R, HG]: q_absᵀ
        head_mask = head_ok[None, :]
        ctx = tl.zeros([R, HG], dtype=tl.float32)
    q_hi = _operand(tl.load(qh_ptr + q_at, mask=head_mask, other=0.0), WIDEN)
    q_lo = _operand(tl.load(ql_ptr + q_at, mask=head_mask, other=0.0), WIDEN)
    for n0 in range(0, N, BT):
        counted, lat, lat_lo, row_scale = _attend_block(
            tok_ptr, cnt_ptr, hi_ptr, lo_ptr, scl_ptr, query, n0, cols, lat_stride, N, BT, HAS_LO, WIDEN, FP8, WIDE
        )
        # smallest first, as split_product sums: lat·q_lo, lat_lo·q_hi, lat·q_hi (and likewise the weights')
        if HEADS_M:
            scores = tl.dot(q_lo, tl.trans(lat))
            if HAS_LO:
                scores = tl.dot(q_hi, tl.trans(lat_lo), scores)
            scores = tl.dot(q_hi, tl.trans(lat), scores)
            p_hi, p_lo, scale, top, total = _attend_weights(scores, counted, row_scale, top, total, FP8, WIDEN, 1)
            ctx = ctx * scale[:, None]
            ctx = tl.dot(p_lo, lat, ctx)
            if HAS_LO:
                ctx = tl.dot(p_hi, lat_lo, ctx)
            ctx = tl.dot(p_hi, lat, ctx)
        else:
            scores = tl.dot(lat, q_lo)
            if HAS_LO:
                scores = tl.dot(lat_lo, q_hi, scores)
            scores = tl.dot(lat, q_hi, scores)
            p_hi, p_lo, scale, top, total = _attend_weights(scores, counted, row_scale, top, total, FP8, WIDEN, 0)
            ctx = ctx * scale[None, :]
            ctx = tl.dot(tl.trans(lat), p_lo, ctx)
            if HAS_LO:
                ctx = tl.dot(tl.trans(lat_lo), p_hi, ctx)
            ctx = tl.dot(tl.trans(lat), p_hi, ctx)
    if HEADS_M:
        ctx = ctx / total[:, None]
    else:
        ctx = ctx / total[None, :]
    if SPLIT_OUT:
        _store_split(out_ptr + q_at, lo_out_ptr + q_at, ctx, head_mask)
    else:
        tl.store(out_ptr + q_at, ctx, mask=head_mask)


@triton.jit
def _store_split(hi_ptrs, lo_ptrs, x, ok):
    """fp32 x stored as `reference.split_bf16`'s bits: hi rounded to bf16 to nearest even, lo the rest rounded."""
    hi = _round_bf16(x)
    tl.store(hi_ptrs, hi, mask=ok)
    tl.store(lo_ptrs, _round_bf16(x - hi.to(tl.float32)), mask=ok)


@triton.jit
def _split_scaled(x_ptr, hi_ptr, lo_ptr, n, scale, BLOCK: tl.constexpr):
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = at < n
    _store_split(hi_ptr + at, lo_ptr + at, tl.load(x_ptr + at, mask=ok, other=0.0) * scale, ok)


SPLIT_BLOCK = 2048  # values a program of `split_scaled`


def split_scaled(x: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.split_bf16(x * scale)` for fp32 x on CUDA in one launch, the same bits (x · scale rounded to fp32,
    then to bf16 to nearest even, the rest likewise; compiled without FMA contraction, which would fold the product
    into the remainder's subtraction): one read of x where torch took a scaled copy and three passes."""
    assert x.dtype == torch.float32, f"split_scaled takes fp32 values, not {x.dtype}"
    x = x.contiguous()
    hi = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    lo = torch.empty_like(hi)
    n = x.numel()
    _split_scaled[(triton.cdiv(n, SPLIT_BLOCK),)](
        x, hi, lo, n, float(scale), BLOCK=SPLIT_BLOCK, num_warps=4, enable_fp_fusion=False
    )
    return hi, lo


def offsets_wide(latents: torch.Tensor) -> bool:
    """Whether `_attend_prompt` must address these latents ([L, R], rows of any stride) with 64-bit offsets: the
    last value's offset from the first, (L - 1) · stride + R - 1, passes int32's largest."""
    rows, rank = latents.shape
    return (rows - 1) * latents.stride(0) + rank - 1 > 2**31 - 1


def prompt_applies(heads: int, rank: int) -> bool:
    """Whether `selected_attention` takes these shapes: a power-of-two rank of at least 16 (its columns are one
    block) and at most 512 (the context is held in registers)."""
    return heads >= 1 and 16 <= rank <= 512 and rank & (rank - 1) == 0


def _capability(x: torch.Tensor) -> tuple[int, int]:
    """The compute capability of x's GPU, (0, 0) off CUDA (Triton's interpreter): what picks a launch here."""
    return torch.cuda.get_device_capability(x.device) if x.is_cuda else (0, 0)


def prompt_launch(capability: tuple[int, int], lo: bool = False) -> dict:
    """`_attend_prompt`'s launch for a GPU of this compute capability, latents with a lo part or not
    (PROMPT_LAUNCHES; the dict itself: a bench may change it)."""
    if capability[0] != 9:
        return PROMPT_LAUNCHES["other_lo" if lo else "other"]
    return PROMPT_LAUNCHES["sm90_lo" if lo else "sm90"]


def head_group(launch: dict, heads: int) -> int:
    """Heads one `_attend_prompt` program takes under `launch`: its group, or all of them padded to a power of two
    (at least 16, the MMA's narrow side) where they are fewer."""
    return min(launch["heads"], max(16, triton.next_power_of_2(heads)))


def selected_attention(
    q_abs: tuple[torch.Tensor, torch.Tensor],
    latents: tuple[torch.Tensor, torch.Tensor | None],
    tokens: torch.Tensor,
    counts: torch.Tensor,
    scales: torch.Tensor | None = None,
    split_out: bool = False,
) -> torch.Tensor | reference.Split:
    """softmax(q_abs · latentsᵀ over each query's selected tokens that count) · latents, for a prompt chunk, head-major
    as the products around it are: q_abs [H, T, R] split (bf16 hi, lo; scaled already), latents [L, R] split (bf16
    hi, lo or None: a bf16 cache's; rows may be strided, as a cache pool layer's latent columns are, read in place),
    tokens [T, N] (rows of the latents; those that do not count are never read), counts [T, N] bool -> [H, T, R]
    fp32 (`split_out`: as its split bf16 pair, `reference.split_bf16`'s bits, for the split product after it).
    `scales` [L] fp32: the latents are fp8 cache rows' values (e4m3, or a bf16 copy of them; no lo part), each
    row's values times its scale — the scale applied to the row's scores and to its softmax weights, so the values
    enter the products exactly, two products a side where a split would take three (e4m3 latents need the type in
    Triton: compute capability 8.9, `fp8_rows_apply`). Every query must have a token that counts (`_select_tokens`
    counts every chosen visible pool, and the sparse regime has more visible pools than it picks)."""
    q_hi, q_lo = (part.contiguous() for part in q_abs)
    lat_hi, lat_lo = latents
    fp8 = scales is not None
    e4m3 = lat_hi.dtype == torch.float8_e4m3fn
    if (e4m3 and not fp8) or (
        scales is not None
        and (
            lat_lo is not None
            or lat_hi.dtype not in (torch.float8_e4m3fn, torch.bfloat16)
            or scales.dtype != torch.float32
            or scales.shape != lat_hi.shape[:1]
        )
    ):
        raise ValueError(
            f"fp8 rows are e4m3 latents (or a bf16 copy) with no lo part and [L] fp32 scales; got latents {lat_hi.dtype} "
            f"{tuple(lat_hi.shape)}, a lo part {lat_lo is not None}, scales "
            f"{None if scales is None else (scales.dtype, tuple(scales.shape))}"
        )
    scales = None if scales is None else scales.contiguous()
    if lat_hi.stride(1) != 1 or (lat_lo is not None and lat_lo.stride() != lat_hi.stride()):
        lat_hi, lat_lo = lat_hi.contiguous(), None if lat_lo is None else lat_lo.contiguous()
    heads, t, rank = q_hi.shape
    n = tokens.shape[1]
    if counts.dtype != torch.bool or tokens.shape != counts.shape or tokens.shape[0] != t:
        raise ValueError(
            f"tokens {tuple(tokens.shape)} and bool counts of that shape for {t} queries, got {counts.dtype}"
        )
    if lat_hi.shape[1] != rank or (lat_lo is not None and lat_lo.shape != lat_hi.shape):
        raise ValueError(f"latents {tuple(lat_hi.shape)} do not have q_abs's rank {rank}")
    launch = prompt_launch(_capability(q_hi), lat_lo is not None)
    group = head_group(launch, heads)
    out = torch.empty(heads, t, rank, dtype=torch.bfloat16 if split_out else torch.float32, device=q_hi.device)
    lo_out = torch.empty_like(out) if split_out else out
    _attend_prompt[(t, triton.cdiv(heads, group))](
        q_hi, q_lo, lat_hi, lat_hi if lat_lo is None else lat_lo, tokens.contiguous(),
        counts.contiguous().view(torch.uint8), out, lo_out, t, N=n, H=heads, HG=group, R=rank, BT=launch["block"],
        HAS_LO=lat_lo is not None, WIDEN=_INTERPRETED, lat_stride=lat_hi.stride(0),
        scl_ptr=scales if fp8 else out, FP8=fp8, WIDE=offsets_wide(lat_hi),
        SPLIT_OUT=split_out, HEADS_M=launch["heads_m"], num_warps=launch["num_warps"], num_stages=launch["num_stages"],
    )  # fmt: skip
    return (out, lo_out) if split_out else out


# the indexer's launch: pools a program, queries a program (sharing its pools' keys where every query reads the same
# ones: a prompt chunk), warps, and the precision of fp32 keys' products ("tf32x3": fp32's accuracy on the tensor
# cores; "ieee": fp32 FMAs, 50x slower on the H200; keys stored as bf16 or e4m3 take the split bf16 form whatever
# this says). The heads are the product's 32-row side (mma.sync's tiles): with the pools as the tall side instead
# (Hopper's warpgroup MMA) it took 0.90 ms against 0.69 for a 2k chunk at 8k on the H200 (docs/BENCHMARKS.md, session
# 23). Shared memory a block for sm_121: 98,560 B (fp32 keys) and 65,792 B (bf16) within the GB10's 101,376 B
INDEX_LAUNCH = {"pools": 64, "queries": 16, "num_warps": 4, "precision": "tf32x3"}
# a prompt chunk's split form (q's parts made once, one set of bf16 or e4m3 keys) takes 128 pools a program: on the
# H100 a 2,048-query chunk at 32k 1.26 ms against 1.60 for 64 pools, at 128k 4.72 against 5.80 (bf16 keys; fp8 the
# same within 2 %; docs/BENCHMARKS.md, session 32); on a GB10 too since session 42: 82,432 B of shared memory a block
# compiled for sm_121, within its 101,376 B, and 16.8 instructions a (query, pool) against 21.6 compiled for sm_89
# (the same MMAs, no spills; not timed on a GB10)
INDEX_LAUNCH_PARTS = {**INDEX_LAUNCH, "pools": 128}
# `_index_scores` compiled with FMA contraction (Triton's default); bench/index_bits_probe.py turns it off to see
# whether contraction is what gives a step's fp8 scores other last bits than a chunk's
INDEX_FP_FUSION = True


def index_launch(capability: tuple[int, int], parts: bool) -> dict:
    """`_index_scores`' launch for a GPU of this compute capability, q taken as its three bf16 parts or not
    (INDEX_LAUNCH_PARTS or INDEX_LAUNCH, the same on every GPU since session 42; the dict itself: a bench may change
    it)."""
    return INDEX_LAUNCH_PARTS if parts else INDEX_LAUNCH


@triton.jit
def _bf16(x, WIDEN: tl.constexpr):
    """fp32 x rounded to bf16 (to nearest, ties to even, as torch rounds); under the interpreter (`WIDEN`), which
    truncates there, the rounded values held as fp32."""
    if WIDEN:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        rounded = bits.to(tl.float32, bitcast=True)
    else:
        rounded = x.to(tl.bfloat16)
    return rounded


@triton.jit
def _bf16_boundary(x):
    """bf16 x as it is (a 16-bit move), in an instruction Triton must keep (not pure). Triton lays a product's
    operands out for the tensor cores by the narrowest type it finds loaded behind them, looking back through pure
    elementwise operations: e4m3 keys loaded as 8-bit values and converted got kWidth 4 where 16-bit operands take 2,
    the K index permuted, so each MMA summed other products first and a decode step's fp8 index scores came out in
    other last bits than a prompt chunk's over the bf16 copy (bench/index_bits_probe.py and the TTGIR, session 34).
    Behind this move it looks no further: the operands of a bf16 pool's, the same sums in the same order. That is
    Triton 3.6's heuristic; tests/gpu/test_rows_gpu.py's fp8 indexer case fails if a later Triton's differs."""
    return tl.inline_asm_elementwise("mov.b16 $0, $1;", "=h,h", [x], dtype=tl.bfloat16, is_pure=False, pack=1)


@triton.jit
def _index_keys(k_ptr, slot_ptr, scl_ptr, at, pools, ok, row_stride, D: tl.constexpr, GATHER: tl.constexpr,
                SCALED: tl.constexpr, SPLIT: tl.constexpr, WIDEN: tl.constexpr):  # fmt: skip
    """The keysᵀ [D, BP] of `pools` as the product takes them — bf16 for keys held as bf16 or e4m3 (`SPLIT`: their
    values exactly), fp32 otherwise — and each one's scale (`SCALED`: fp8 rows'; ones otherwise). A key is row
    `at + pool` of k_ptr, or (`GATHER`) the row whose index slot_ptr holds there: a cache pool's slot."""
    dims = tl.arange(0, D)
    if GATHER:  # each pool's key where the cache pool holds it: the key columns of the slot of its last row
        rows = tl.load(slot_ptr + at + pools, mask=ok, other=0)
    else:
        rows = at + pools.to(tl.int64)
    keys = tl.load(k_ptr + rows[None, :] * row_stride + dims[:, None], mask=ok[None, :], other=0.0)
    if SCALED:  # the row's scale goes on the product (KVPool.read gives value × scale)
        key_scale = tl.load(scl_ptr + rows, mask=ok, other=1.0)
    else:
        key_scale = tl.full(pools.shape, 1.0, tl.float32)
    if SPLIT:  # an e4m3 value is a bf16 value exactly (session 33's GPU test: every e4m3 value, both conversions)
        operand = keys.to(tl.float32).to(tl.bfloat16)
        if k_ptr.dtype.element_ty == tl.float8e4nv and not WIDEN:  # the interpreter has no layouts to choose
            operand = _bf16_boundary(operand)
        operand = _operand(operand, WIDEN)
    else:
        operand = keys.to(tl.float32)
    return operand, key_scale


@triton.jit
def _index_scores(
    q_ptr,
    k_ptr,
    w_ptr,
    pos_ptr,
    out_ptr,
    T,
    P,
    scale,
    KPOOL: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    BP: tl.constexpr,
    QB: tl.constexpr,
    SHARED: tl.constexpr,
    PRECISION: tl.constexpr,
    slot_ptr,
    scl_ptr,
    row_stride,
    GATHER: tl.constexpr,
    SCALED: tl.constexpr,
    SPLIT: tl.constexpr,  # bf16 keys (stored as bf16 or e4m3) against q in three bf16 parts whose sum is q
    PARTS: tl.constexpr,  # q_ptr holds those parts [3, T, H, D] (made once for the launch), else fp32 q split here
    WIDEN: tl.constexpr,
):
    pools = tl.program_id(0) * BP + tl.arange(0, BP)
    pool_ok = pools < P
    heads = tl.arange(0, H)
    dims = tl.arange(0, D)
    if SHARED:  # one set of keys for every query, read once
        keys, key_scale = _index_keys(k_ptr, slot_ptr, scl_ptr, 0, pools, pool_ok, row_stride, D, GATHER, SCALED,
                                      SPLIT, WIDEN)  # fmt: skip
    for i in range(QB):
        t = tl.program_id(1) * QB + i
        ok = t < T
        t64 = t.to(tl.int64)
        if not SHARED:  # the query's own keys
            keys, key_scale = _index_keys(k_ptr, slot_ptr, scl_ptr, t64 * P, pools, pool_ok & ok, row_stride, D,
                                          GATHER, SCALED, SPLIT, WIDEN)  # fmt: skip
        q_at = q_ptr + (t64 * H + heads[:, None]) * D + dims[None, :]  # [H, D]
        if PARTS:
            q_hi = tl.load(q_at, mask=ok, other=0.0)
            q_mid = tl.load(q_at + T * H * D, mask=ok, other=0.0)
            q_lo = tl.load(q_at + 2 * T * H * D, mask=ok, other=0.0)
        else:
            q = tl.load(q_at, mask=ok, other=0.0)
            if SPLIT:  # as reference.split_bf16x3
                q_hi = _bf16(q, WIDEN)
                rest = q - q_hi.to(tl.float32)
                q_mid = _bf16(rest, WIDEN)
                q_lo = _bf16(rest - q_mid.to(tl.float32), WIDEN)
        if SPLIT:  # every partial product exact in fp32, summed smallest first
            raw = tl.dot(_operand(q_lo, WIDEN), keys)
            raw = tl.dot(_operand(q_mid, WIDEN), keys, raw)
            raw = tl.dot(_operand(q_hi, WIDEN), keys, raw) * key_scale[None, :]
        else:
            raw = tl.dot(q, keys, input_precision=PRECISION)
        scores = tl.maximum(raw * scale, 0.0)  # [H, BP]
        w = tl.load(w_ptr + t64 * H + heads, mask=ok, other=0.0)
        index = tl.sum(w[:, None] * scores, axis=0)
        visible = pools * KPOOL + KPOOL - 1 <= tl.load(pos_ptr + t, mask=ok, other=0)
        index = tl.where(visible, index, -3.4028234663852886e38)
        tl.store(out_ptr + t64 * P + pools, index, mask=pool_ok & ok)


def index_applies(q: torch.Tensor, keys: torch.Tensor | PoolKeys) -> bool:
    """Whether `index_scores` takes these shapes: heads and key width powers of two of at least 16 (the MMA's sides),
    fp32 queries, keys fp32 or bf16 and shared by every query or one set a query — or left in the cache pool
    (`PoolKeys`, one set for every query or one a query; fp8 rows where the GPU has the type)."""
    _, heads, dim = q.shape
    if isinstance(keys, PoolKeys):
        fits = keys.pool.scales is None or fp8_rows_apply(q.device)
    else:
        fits = keys.dtype in (torch.float32, torch.bfloat16)
    return (
        fits
        and keys.shape[0] in (1, q.shape[0])
        and heads >= 16
        and heads & (heads - 1) == 0
        and dim >= 16
        and dim & (dim - 1) == 0
        and keys.shape[-1] == dim
        and q.dtype == torch.float32
    )


def index_scores(
    q: torch.Tensor,
    keys: torch.Tensor | PoolKeys,
    head_w: torch.Tensor,
    positions: torch.Tensor,
    kpool: int,
    scale: float,
) -> torch.Tensor:
    """`reference.index_scores` in one launch, nothing [T, h, P] in memory: a program per (block of pools, block of
    queries), each query's heads × pools product on the tensor cores, relu, weighted and summed over the heads in
    registers. A query's scores are computed alone (its own product, the same blocks whatever the other queries or
    how many there are), so they have the same bits in a prompt chunk, a decode step or a verify window.

    Keys held as bf16 or e4m3 — a bf16 tensor, or `PoolKeys` of a bf16 or fp8 cache pool — are bf16 values exactly:
    the product takes them as they are against q in three bf16 parts whose sum is q (`reference.split_bf16x3`), each
    partial product exact, the sums in fp32, an fp8 row's scale on the product. That is half the tensor-core
    products of tf32x3 and no split of the keys; with one set of keys for every query (a prompt chunk) q's parts are
    made once for the launch, not once a program. fp32 keys take `INDEX_LAUNCH`'s precision (tf32x3). A prompt
    chunk and a decode step read the same cache pool, so a query's operands — and its bits — are the same in both.

    `PoolKeys`: each pool's key read where the cache pool holds it (a decode step's, one set a query), not gathered
    into an fp32 copy; a prompt chunk's one set of fp8 keys is taken as a bf16 copy of the stored values and their
    scales (the e4m3 rows converted inside the kernel took ~2.4x its instructions a query)."""
    t, heads, dim = q.shape
    n_pools = keys.shape[-2]
    out = torch.empty(t, n_pools, dtype=torch.float32, device=q.device)
    if t == 0 or n_pools == 0:
        return out
    shared = keys.shape[0] == 1 and t > 1  # one query (a batch-1 step) takes its keys as its own: one pass a program
    slots: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    if isinstance(keys, PoolKeys):
        source, scales = keys.in_place()
        slots, stride = keys.slots.contiguous(), source.stride(0)
        if shared and scales is not None:  # the stored values as bf16 and their scales, one row a pool
            (source, scales), slots, stride = keys.stored_bf16(), None, dim
    else:
        source, stride = keys.contiguous(), dim
    split = source.dtype != torch.float32
    parts = split and shared
    launch = index_launch(_capability(q), parts)
    queries = launch["queries"] if shared else 1
    grid = (triton.cdiv(n_pools, launch["pools"]), triton.cdiv(t, queries))
    _index_scores[grid](
        reference.split_bf16x3(q) if parts else q.contiguous(), source, head_w.contiguous(),
        positions.contiguous(), out, t, n_pools, float(scale), KPOOL=kpool, H=heads, D=dim, BP=launch["pools"],
        QB=queries, SHARED=shared, PRECISION=launch["precision"], slot_ptr=slots if slots is not None else positions,
        scl_ptr=scales if scales is not None else out, row_stride=stride, GATHER=slots is not None,
        SCALED=scales is not None, SPLIT=split, PARTS=parts, WIDEN=_INTERPRETED, num_warps=launch["num_warps"],
        enable_fp_fusion=INDEX_FP_FUSION,
    )  # fmt: skip
    return out


@triton.jit
def _pool_key_rows(
    pool_ptr,
    scale_ptr,
    rows_ptr,
    slots_ptr,
    pos_ptr,
    table_ptr,
    ape_ptr,
    table_stride,
    W: tl.constexpr,
    WP: tl.constexpr,
    RANK: tl.constexpr,
    D: tl.constexpr,
    KPOOL: tl.constexpr,
    FP8: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + r)
    if pos % KPOOL == KPOOL - 1:  # this row completes its pool: the others leave the pool as written
        cols = tl.arange(0, D)
        members = table_ptr + r * table_stride + pos - (KPOOL - 1)
        top = tl.full([D], float("-inf"), tl.float32)
        for i in tl.static_range(KPOOL):  # the largest gate score (+ ape) a channel
            slot = tl.load(members + i)
            gate = tl.load(pool_ptr + slot * W + RANK + D + cols).to(tl.float32)
            if FP8:
                gate = gate * tl.load(scale_ptr + slot)
            top = tl.maximum(top, gate + tl.load(ape_ptr + i * D + cols))
        total = tl.zeros([D], tl.float32)
        weighted = tl.zeros([D], tl.float32)
        for i in tl.static_range(KPOOL):  # Σ e_i and Σ e_i k_i in the tokens' order
            slot = tl.load(members + i)
            gate = tl.load(pool_ptr + slot * W + RANK + D + cols).to(tl.float32)
            key = tl.load(pool_ptr + slot * W + RANK + cols).to(tl.float32)
            if FP8:
                scale = tl.load(scale_ptr + slot)
                gate = gate * scale
                key = key * scale
            weight = tl.exp(gate + tl.load(ape_ptr + i * D + cols) - top)
            total += weight
            weighted += weight * key
        pooled = weighted / total
        slot = tl.load(slots_ptr + r)
        out = pool_ptr + slot * W
        if FP8:  # the row again under one scale that covers the pool key: latent and gate score from the fp32 row
            every = tl.arange(0, WP)
            rest = (every < W) & ((every < RANK) | (every >= RANK + D))
            row = tl.load(rows_ptr + r * W + every, mask=rest, other=0.0)
            amax = tl.maximum(tl.max(tl.abs(row), axis=0), tl.max(tl.abs(pooled), axis=0))
            scale = tl.math.div_rn(tl.maximum(amax, 1e-12), 448.0)  # IEEE divisions, as KVPool.write's
            tl.store(out + every, tl.math.div_rn(row, scale).to(pool_ptr.dtype.element_ty), mask=rest)
            tl.store(out + RANK + cols, tl.math.div_rn(pooled, scale).to(pool_ptr.dtype.element_ty))
            tl.store(scale_ptr + slot, scale)
        else:
            tl.store(out + RANK + cols, pooled.to(pool_ptr.dtype.element_ty))


def fp8_rows_apply(device: torch.device) -> bool:
    """Whether the kernels here may read and write fp8 (e4m3) cache rows on this GPU: compute capability 8.9 or later
    (Triton has no e4m3 type before it; the torch forms run there)."""
    return torch.cuda.get_device_capability(device) >= (8, 9)


def pool_keys_apply(rows: torch.Tensor, dim: int, fp8: bool) -> bool:
    """Whether `complete_pools` takes these rows: on CUDA, index keys a power of two wide, fp8 cache rows only where
    the GPU has the type (the choice is the same for the whole process: prompt chunks and steps agree)."""
    return rows.is_cuda and dim >= 1 and dim & (dim - 1) == 0 and (not fp8 or fp8_rows_apply(rows.device))


def complete_pools(
    pool_rows: torch.Tensor,
    scales: torch.Tensor | None,
    rows: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    table: torch.Tensor,
    ape: torch.Tensor,
    rank: int,
    kpool: int,
) -> None:
    """DSA's pool keys in one launch (engine/models/glm5_next/dsa.py `SparseMLA._store`): for each new row
    (fp32 `rows` [n, W], already written at `slots` [n]) whose position completes its pool, the pool's key from its
    tokens' rows as the pool holds them (their slots in `table` [n or 1, span] by position), written into the row's
    key columns — with fp8 rows (`scales`) the whole row again under a scale that covers the key. A program a row,
    the pooling in the tokens' order: a key's bits do not depend on the other rows, nor on which step writes it
    (prompt chunk, decode step, verify window, MTP draft). The torch form took about twenty launches a layer."""
    n, width = rows.shape
    if n == 0:
        return
    assert pool_rows.stride(0) == width and pool_rows.stride(1) == 1 and table.stride(-1) == 1
    assert slots.dtype == positions.dtype == table.dtype == torch.int64
    _pool_key_rows[(n,)](
        pool_rows, scales if scales is not None else pool_rows, rows.contiguous(), slots.contiguous(),
        positions.contiguous(), table, ape.contiguous(), table.stride(0) if table.shape[0] > 1 else 0,
        W=width, WP=triton.next_power_of_2(width), RANK=rank, D=ape.shape[-1], KPOOL=kpool, FP8=scales is not None,
        num_warps=4,
    )  # fmt: skip


# `top_pools`' block of scores a step, bits a pass, warps, and the programs it aims for (a query's span is cut into
# segments of whole blocks until queries × segments reach them); it takes every count of queries. On the H100
# (docs/BENCHMARKS.md, session 33; 512 pools chosen, ms) it beats the torch form at every count of queries and span:
# at a 1M span (262,144 pools) 1 query 0.034 against 0.115, 8: 0.073 / 0.832, 64: 0.50 / 1.53, 128: 0.98 / 2.15,
# 2,048: 12.1 / 24.4; at 32k 1 query 0.020 / 0.072. Session 32's form, a program a query, took 1.41 ms for one
# query at 1M: the segments are what let a decode step's query and a long span's blocks of 64-128 use it.
TOP_POOLS_LAUNCH = {"block": 1024, "bits": 8, "num_warps": 4, "programs": 512, "one_launch_pools": 2048}


@triton.jit
def _order_key(x):
    """fp32 scores as uint32 keys in the same order (NaN aside; -0.0 taken as 0.0, which it equals): a positive's
    sign bit set, a negative's every bit flipped."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.uint32, bitcast=True)
    return bits ^ tl.where((bits >> 31) != 0, 0xFFFFFFFF, 0x80000000).to(tl.uint32)


@triton.jit
def _segment_keys(index_ptr, P, end, start, BLOCK: tl.constexpr):
    """The keys of query program_id(0)'s scores start .. start + BLOCK, and which of them lie before `end`."""
    at = start + tl.arange(0, BLOCK)
    ok = at < end
    return at, ok, _order_key(tl.load(index_ptr + tl.program_id(0).to(tl.int64) * P + at, mask=ok, other=0.0))


@triton.jit
def _pool_digits(
    index_ptr, state_ptr, counts_ptr, P, SEG, SHIFT: tl.constexpr, BLOCK: tl.constexpr, BITS: tl.constexpr
):
    # one pass of the radix select, a program a (query, segment): how many keys of the segment have each value of
    # the digit at SHIFT among those whose higher bits are the k-th best key's chosen so far (state), added into
    # the query's counts. `while` loops: Triton's interpreter takes no argument as a `range` bound.
    row = tl.program_id(0).to(tl.int64)
    counts = tl.zeros([1 << BITS], dtype=tl.int32)
    high = tl.zeros([], dtype=tl.uint32)
    if SHIFT + BITS < 32:  # the first pass has chosen nothing yet
        high = tl.load(state_ptr + row * 2).to(tl.uint32, bitcast=True) >> (SHIFT + BITS)
    start = tl.program_id(1) * SEG
    end = tl.minimum(start + SEG, P)
    while start < end:
        at, ok, key = _segment_keys(index_ptr, P, end, start, BLOCK)
        if SHIFT + BITS < 32:
            ok &= (key >> (SHIFT + BITS)) == high
        counts += tl.histogram(((key >> SHIFT) & ((1 << BITS) - 1)).to(tl.int32), 1 << BITS, mask=ok)
        start += BLOCK
    tl.atomic_add(counts_ptr + row * (1 << BITS) + tl.arange(0, 1 << BITS), counts, sem="relaxed")


@triton.jit
def _digit_of(counts, kth, wanted, SHIFT: tl.constexpr, BITS: tl.constexpr):
    """The digit where the count from the top reaches the rank still wanted: the k-th best key's bits so far with it
    at SHIFT, and its rank among the keys that share them."""
    digits = tl.arange(0, 1 << BITS)
    above = tl.sum(counts, 0) - tl.cumsum(counts, 0)  # keys whose digit is above each digit's
    here = (above < wanted) & (above + counts >= wanted)
    wanted -= tl.sum(tl.where(here, above, 0), 0)
    kth |= tl.sum(tl.where(here, digits, 0), 0).to(tl.uint32) << SHIFT
    return kth, wanted


@triton.jit
def _pool_digit(state_ptr, counts_ptr, K, SHIFT: tl.constexpr, BITS: tl.constexpr):
    # a program a query: `_digit_of` the query's counts, into the state
    row = tl.program_id(0).to(tl.int64)
    counts = tl.load(counts_ptr + row * (1 << BITS) + tl.arange(0, 1 << BITS))
    if SHIFT + BITS < 32:
        kth = tl.load(state_ptr + row * 2).to(tl.uint32, bitcast=True)
        wanted = tl.load(state_ptr + row * 2 + 1)
    else:
        kth = tl.zeros([], dtype=tl.uint32)
        wanted = K
    kth, wanted = _digit_of(counts, kth, wanted, SHIFT, BITS)
    tl.store(state_ptr + row * 2, kth.to(tl.int32, bitcast=True))
    tl.store(state_ptr + row * 2 + 1, wanted)


@triton.jit
def _pool_ties(index_ptr, state_ptr, segments_ptr, P, SEG, BLOCK: tl.constexpr):
    # a program a (query, segment): how many of the segment's keys are above the k-th best and how many equal it
    row = tl.program_id(0).to(tl.int64)
    kth = tl.load(state_ptr + row * 2).to(tl.uint32, bitcast=True)
    above = tl.zeros([], dtype=tl.int32)
    tied = tl.zeros([], dtype=tl.int32)
    start = tl.program_id(1) * SEG
    end = tl.minimum(start + SEG, P)
    while start < end:
        at, ok, key = _segment_keys(index_ptr, P, end, start, BLOCK)
        above += tl.sum((ok & (key > kth)).to(tl.int32), 0)
        tied += tl.sum((ok & (key == kth)).to(tl.int32), 0)
        start += BLOCK
    at = segments_ptr + (row * tl.num_programs(1) + tl.program_id(1)) * 2
    tl.store(at, above)
    tl.store(at + 1, tied)


@triton.jit
def _pool_take(index_ptr, out_ptr, state_ptr, segments_ptr, P, K, SEG, BLOCK: tl.constexpr, SEGMENTS: tl.constexpr):
    # a program a (query, segment): every pool above the k-th best key and the earliest `wanted` tied with it, at
    # their places in position order (after those the earlier segments take)
    row = tl.program_id(0).to(tl.int64)
    kth = tl.load(state_ptr + row * 2).to(tl.uint32, bitcast=True)
    wanted = tl.load(state_ptr + row * 2 + 1)
    earlier = tl.arange(0, SEGMENTS)
    sums = segments_ptr + (row * tl.num_programs(1) + earlier) * 2
    before = earlier < tl.program_id(1)
    ties = tl.sum(tl.load(sums + 1, mask=before, other=0), 0)
    taken = tl.sum(tl.load(sums, mask=before, other=0), 0) + tl.minimum(ties, wanted)
    start = tl.program_id(1) * SEG
    _take(index_ptr, out_ptr, P, K, start, tl.minimum(start + SEG, P), kth, wanted, taken, ties, BLOCK)


@triton.jit
def _take(index_ptr, out_ptr, P, K, start, end, kth, wanted, taken, ties, BLOCK: tl.constexpr):
    """Query program_id(0)'s pools start .. end above the k-th best key, and those tied with it while the ties so
    far stay within `wanted`, into their places in position order after the `taken` before them."""
    row = tl.program_id(0).to(tl.int64)
    while start < end:
        at, ok, key = _segment_keys(index_ptr, P, end, start, BLOCK)
        tied = ok & (key == kth)
        take = (ok & (key > kth)) | (tied & (ties + tl.cumsum(tied.to(tl.int32), 0) <= wanted))
        place = taken + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(out_ptr + row * K + place, at.to(tl.int64), mask=take & (place < K))
        taken += tl.sum(take.to(tl.int32), 0)
        ties += tl.sum(tied.to(tl.int32), 0)
        start += BLOCK


@triton.jit
def _pool_select(index_ptr, out_ptr, P, K, BLOCK: tl.constexpr, BITS: tl.constexpr):
    # a program a query, its whole span: the radix select's passes (`_pool_digits` and `_pool_digit` in turn, the
    # counts kept in registers) and the take (`_pool_take`), in one launch: the same k-th best key, the same pools
    kth = tl.zeros([], dtype=tl.uint32)
    wanted = K
    zero = tl.zeros([], dtype=tl.int32)
    for i in tl.static_range(32 // BITS):
        shift = 32 - BITS * (i + 1)
        counts = tl.zeros([1 << BITS], dtype=tl.int32)
        start = zero
        while start < P:
            at, ok, key = _segment_keys(index_ptr, P, P, start, BLOCK)
            if i > 0:  # the first pass has chosen nothing yet
                ok &= (key >> (shift + BITS)) == (kth >> (shift + BITS))
            counts += tl.histogram(((key >> shift) & ((1 << BITS) - 1)).to(tl.int32), 1 << BITS, mask=ok)
            start += BLOCK
        kth, wanted = _digit_of(counts, kth, wanted, shift, BITS)
    _take(index_ptr, out_ptr, P, K, zero, P, kth, wanted, zero, zero, BLOCK)


def top_pools_applies(index: torch.Tensor) -> bool:
    """Whether `top_pools` takes these scores: [T, P] fp32 on CUDA, any T (session 32's kernel took 512 or more)."""
    return index.is_cuda and index.dtype == torch.float32 and index.dim() == 2


def top_pools_segments(queries: int, n_pools: int) -> int:
    """The scores a program of `top_pools` reads of its query's span: whole blocks, as few as give the launch's
    programs (one segment a query where there are enough queries)."""
    launch = TOP_POOLS_LAUNCH
    blocks = -(-n_pools // launch["block"])
    segments = min(blocks, max(1, -(-launch["programs"] // max(queries, 1))))
    return -(-blocks // segments) * launch["block"]


def top_pools(index: torch.Tensor, k: int) -> torch.Tensor:
    """`reference.top_pools` by a radix select: the same pools (exactly the first k of a stable descending sort, in
    position order). Each query's span is cut into segments (`top_pools_segments`); 32 / bits passes each count one
    digit of the keys that may still be the k-th best (a launch over the segments, then one a query to choose the
    digit; four passes of a byte each), then one launch counts each segment's pools above the k-th best and tied
    with it (where a query has more than one segment) and one writes every pool above it and the earliest tied ones.
    Where a query's span is one segment, or at most `one_launch_pools` pools (an 8k span's: two blocks, which one
    program reads in turn), one program a query does all of it in one launch (`_pool_select`; a decode step's
    choice up to that span was ten launches of one program a query, ~20 µs of a step's DSA layer on an H100).
    The torch form ran a selection over the span, then about ten [T, P] passes (masks, two running counts, a
    search). No host reads (a graph holds it).
    Scores must not be NaN (a row with one: the kernel ranks it by its bits, the torch form differently)."""
    t, n_pools = index.shape
    launch = TOP_POOLS_LAUNCH
    bits, block, warps = launch["bits"], launch["block"], launch["num_warps"]
    if not 0 <= k <= n_pools or 32 % bits or bits > 16:
        raise ValueError(f"top_pools takes 0 <= k <= {n_pools} pools and bits dividing 32, at most 16; got {k}, {bits}")
    out = torch.empty(t, k, dtype=torch.int64, device=index.device)
    if t == 0 or k == 0:
        return out
    index = index.contiguous()
    seg = top_pools_segments(t, n_pools)
    grid = (t, -(-n_pools // seg))
    if grid[1] == 1 or n_pools <= launch["one_launch_pools"]:  # one program a query, every pass: one launch
        _pool_select[(t,)](index, out, n_pools, k, BLOCK=block, BITS=bits, num_warps=warps)
        return out
    state = torch.empty(t, 2, dtype=torch.int32, device=index.device)  # the k-th best key's bits, the rank wanted
    counts = torch.zeros(32 // bits, t, 1 << bits, dtype=torch.int32, device=index.device)
    for i, shift in enumerate(range(32 - bits, -1, -bits)):
        _pool_digits[grid](index, state, counts[i], n_pools, seg, SHIFT=shift, BLOCK=block, BITS=bits, num_warps=warps)
        _pool_digit[(t,)](state, counts[i], k, SHIFT=shift, BITS=bits, num_warps=warps)
    segments = torch.empty(*grid, 2, dtype=torch.int32, device=index.device)
    if grid[1] > 1:  # one segment a query has no earlier segments to count
        _pool_ties[grid](index, state, segments, n_pools, seg, BLOCK=block, num_warps=warps)
    _pool_take[grid](
        index, out, state, segments, n_pools, k, seg, BLOCK=block, SEGMENTS=triton.next_power_of_2(grid[1]),
        num_warps=warps,
    )  # fmt: skip
    return out


POOL_TOKENS_BLOCK = 1024  # columns a `_pool_tokens` program writes (3 programs a row for the served 2,052)


@triton.jit
def _pool_tokens(
    chosen_ptr,
    positions_ptr,
    table_ptr,
    tokens_ptr,
    counts_ptr,
    C,
    N,
    S,
    table_stride,
    n_pools,
    tail_cap,
    KPOOL: tl.constexpr,
    POOLS: tl.constexpr,
    CHOSEN: tl.constexpr,
    CAP: tl.constexpr,
    TABLE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # a program a (query, block of columns): `reference.pool_tokens` for those columns, each by its own arithmetic
    # (no column reads another's)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < N
    position = tl.load(positions_ptr + row)
    c = cols // KPOOL
    pooled = c < POOLS
    taken = c < C
    pool = c.to(tl.int64)
    if CHOSEN:
        pool = tl.where(taken, tl.load(chosen_ptr + row * C + c, mask=live & taken, other=0), pool)
    counted = taken & (pool * KPOOL + KPOOL - 1 <= position)
    start = (position + 1) - (position + 1) % KPOOL  # the query's unfinished pool
    tail = start + (cols - POOLS * KPOOL)
    tail_counted = tail <= position
    if CAP:
        tail_counted &= tl.minimum((position + 1) // KPOOL, n_pools) <= tail_cap
    token = tl.where(pooled, pool * KPOOL + cols % KPOOL, tail)
    if TABLE:
        token = tl.load(table_ptr + row * table_stride + tl.minimum(token, S - 1), mask=live, other=0)
    tl.store(tokens_ptr + row * N + cols, token, mask=live)
    tl.store(counts_ptr + row * N + cols, tl.where(pooled, counted, tail_counted), mask=live)


def pool_tokens_applies(positions: torch.Tensor) -> bool:
    """Whether `pool_tokens` takes these queries: positions [T] int64 on CUDA."""
    return positions.is_cuda and positions.dtype == torch.int64 and positions.dim() == 1


def pool_tokens(
    chosen: torch.Tensor | None,
    positions: torch.Tensor,
    kpool: int,
    pools: int,
    n_pools: int,
    tail_cap: int | None,
    table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference.pool_tokens` in one launch (the torch form is about twenty: aranges, products, comparisons,
    expansions, concatenations, the table's clamp and gather): the same tokens (or slots) and counts."""
    rows = positions.shape[0]
    width = pools * kpool + kpool
    taken = min(n_pools, pools) if chosen is None else chosen.shape[1]
    if chosen is not None:
        chosen = chosen.contiguous()
        if chosen.dtype != torch.int64 or taken > pools:
            raise ValueError(f"pool_tokens takes int64 choices of at most {pools} pools; got {chosen.dtype} [{taken}]")
    out_type = torch.int64 if table is None else table.dtype
    tokens = torch.empty(rows, width, dtype=out_type, device=positions.device)
    counts = torch.empty(rows, width, dtype=torch.bool, device=positions.device)
    if rows == 0:
        return tokens, counts
    if table is not None and (table.stride(1) != 1 or table.shape[0] not in (1, rows)):
        table = table.expand(rows, -1).contiguous()
    span = 1 if table is None else table.shape[1]
    table_stride = 0 if table is None or table.shape[0] == 1 else table.stride(0)
    _pool_tokens[(rows, triton.cdiv(width, POOL_TOKENS_BLOCK))](
        positions if chosen is None else chosen, positions, positions if table is None else table, tokens, counts,
        taken, width, span, table_stride, n_pools, 0 if tail_cap is None else tail_cap, KPOOL=kpool, POOLS=pools,
        CHOSEN=chosen is not None, CAP=tail_cap is not None, TABLE=table is not None, BLOCK=POOL_TOKENS_BLOCK,
    )  # fmt: skip
    return tokens, counts
