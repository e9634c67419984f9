"""Products with reduced-precision dense weights (engine/quant/dense.py: q4 codes with per-group fp16 scale and
offset, or e4m3 with per-group scales) for decode rows and verify windows, on the GPU: `_dense_rows`, a Gluon kernel
(its register layouts written out).

The weight is the tensor cores' first operand (`mma.sync` m16n8k16, outputs × inputs) and a block of ROWS rows the
second, so the stored bytes go from memory straight into the MMA's operand registers — no shared memory (but the one
word a split launch's count passes through), no layout conversion: each thread loads its outputs' bytes as vectors (the weights are stored output-major) and one inline-PTX
step a 32-bit word makes them 16-bit operands:
- q4 (`_Q4_UNPACK`): eight nibbles as bf16 128 + q — a mask and a byte permute a pair put each code under the byte
  0x43, the bf16 bits of 128 + q, exactly. A group's bytes hold its inputs 0..31 in their low nibbles and 32..63 in
  their high ones, so each half meets 32 consecutive inputs of the rows (the rows' values load as 16-byte vectors).
  Per group of 64 inputs, Σ x·(128 + q) and Σ x (the same MMA with ones) are scaled once:
  Σ x·w = s·Σ x·(128 + q) + (z − 128·s)·Σ x. A group's s and z of an output come as one 32-bit word
  (`QuantWeight.words`): a load instruction an output where two separate rows took two.
- fp8 (`_FP8_UNPACK`): four e4m3 values as fp16, one conversion a pair (every e4m3 value is an fp16 one); the rows
  rounded to fp16 (finer than bf16; a value past 65,504 would overflow: the dense layers' inputs are normed, clamped
  (SwiGLU) or attention outputs, far below); per group Σ x·v scaled once by s.
Which MMA row computes which output is free (`sigma`, a launch key): in the outputs' order an MMA tile gives a thread
outputs 8 apart, so a group's scales take a load instruction an output and the sums a store each; in σ order
(`_sigma`) a thread's 4 or 8 outputs are side by side, its scales one vector and its sums vector stores, the reorder
proved free of data movement at compile time (`gl.convert_layout(..., assert_trivial=True)`) — the same operations
for each output, so the same bits. The table takes it for fp8 weights and for q4 weights of 32 outputs a warp
(docs/BENCHMARKS.md, sessions 46 and 47).
So the products use the stored values exactly and the scales in fp32 after — about 1.5 (fp8) and 2.3–2.8 (q4)
instructions a weight, against 6–9 when each weight was made bf16 through shared memory and scaled one by one (the
form measured before, docs/BENCHMARKS.md).

Row-invariant: the launch (block, warps, the split of the inputs, loads ahead) comes from the weight's shape alone and
rows go in fixed blocks of ROWS, each its own MMA column, so a row's bits never depend on how many rows share the call
(drafted ≡ serial rests on it). With the inputs split in S slices, the S partial tiles are summed in slice order
(fixed, not atomics) by the tile's program that finishes last — a counter a tile says which; no second launch. The
counters are a device's, so split launches on one device must not overlap (the engine runs one stream a rank).
Gluon kernels do not run in Triton's CPU interpreter: tests/engine compiles this one for sm_90 and sm_121 (no shared
memory but that word, mma.sync) and checks its arithmetic in torch; tests/gpu its numbers.

Prompt chunks multiply by the weight made bf16 for the call (engine/ops/fused.py `linear`): `dequantized`, one Triton
launch (`_dequantize`, a plain Triton kernel: it runs in the interpreter) writing it from the stored bytes, in place of
`QuantWeight.dequantize`'s torch steps — five elementwise launches a weight, more time than the matmul at a 2,048-row
chunk. On the H200 (timed ad hoc, session 20) a q4 4096 × 4096 weight takes 11 µs instead of 203 (3.8 TB/s) and
the chunk's product 129 µs instead of 307 (the matmul alone 116). Its bits are `dequantize`'s: each value made in
fp32 as torch makes it — q4's product then sum, each rounded (compiled with enable_fp_fusion=False, so no FMA; the
product of a 4-bit code and an fp16 scale is exact anyway), fp8's product — then rounded to nearest even.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from engine.quant.dense import TILE

ROWS = 8  # rows a program: the MMA's n (the rows are its second operand)
# the launch (`launch_shape`, from the sweeps on the H200 and the H100 in docs/BENCHMARKS.md): outputs a program and a
# warp (64 a warp from TALL outputs on where a slice holds TALL_GROUPS groups or more, else 32), the grid size the
# split of the inputs aims for (an fp8 weight of HEAD outputs or more — an LM head or its TP share — HEAD_PROGRAMS), at
# most this many slices, the operands' k_width, and below UNROLL_BELOW programs (fp8: always) two groups' weights
# loaded before the first is used
BLOCK_O, TALL, TALL_GROUPS, PROGRAMS, MAX_SPLITS, KW, UNROLL_BELOW = 128, 12288, 8, 512, 16, 8, 1024
HEAD, HEAD_PROGRAMS = 32768, 2048
# a weight of 32 outputs a warp whose slices take at least this many loop turns (by mode) launches one row through
# the kernel compiled for any row count (`launch_shape`'s one_row; session 47's H100 tables)
ANY_ROWS_TURNS = {"q4": 2, "fp8": 4}
# `_dequantize`'s tile — outputs and groups a program, warps: of 14 timed ad hoc on the H200 at seven q4 and fp8
# shapes, the fastest or within 1 µs of it at each (3.4–3.8 TB/s where groups divide the width); its scales fewer than
# its threads, so Triton loads them in the bytes' layout (no shared memory)
DEQUANT_O, DEQUANT_GROUPS, DEQUANT_WARPS = 16, 4, 4
COUNTS = 1 << 15  # tiles (blocks of outputs × blocks of rows) one launch may have: the slice counters a device keeps

# q4: eight codes (a 32-bit word: four bytes, two nibbles each) -> the low nibbles as four bf16 (two registers) and the
# high ones as four more: each nibble q masked out, then a byte permute puts it under the byte 0x43, the bf16 bits of
# 128 + q (exact for q < 128)
_Q4_UNPACK = gl.constexpr("""{
.reg .b32 t, u, c;
mov.b32 c, 0x43434343;
and.b32 t, $4, 0x0F0F0F0F;
prmt.b32 $0, t, c, 0x5140;
prmt.b32 $1, t, c, 0x7362;
shr.u32 u, $4, 4;
and.b32 u, u, 0x0F0F0F0F;
prmt.b32 $2, u, c, 0x5140;
prmt.b32 $3, u, c, 0x7362;
}""")
# fp8: four e4m3 values (a 32-bit word) -> four fp16 (two registers), one conversion a pair (exact: every e4m3 value
# is an fp16 one)
_FP8_UNPACK = gl.constexpr("""{
.reg .b16 lo, hi;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.e4m3x2 $0, lo;
cvt.rn.f16x2.e4m3x2 $1, hi;
}""")


@gluon.jit
def _load(ptrs, ok, k0, j, k_stop, EVEN: gl.constexpr):
    """A group's values at `ptrs` (its input k0 + j at j) where `ok` and before k_stop: one test a group where every
    group is whole (the loads stay vectors), else input by input for every group (an fp8 weight whose input width 64
    does not divide: byte loads, a rare shape)."""
    if EVEN:
        return gl.load(ptrs, mask=ok & (k0 < k_stop), other=0)
    else:
        return gl.load(ptrs, mask=ok & (k0 + j < k_stop), other=0)


@gluon.jit
def _sigma(i, BLOCK_O: gl.constexpr, WARPS: gl.constexpr):
    """The output MMA row i stands for: row i = r·16·WARPS + w·16 + h·8 + q (warp w, quad q, half h, repetition r)
    holds output w·BLOCK_O/WARPS + q·PER + 2r + h, so a thread's PER rows are PER side-by-side outputs."""
    PER: gl.constexpr = BLOCK_O // (8 * WARPS)
    r = i // (16 * WARPS)
    w = (i // 16) % WARPS
    h = (i // 8) % 2
    q = i % 8
    return w * (BLOCK_O // WARPS) + q * PER + 2 * r + h


@gluon.constexpr_function
def _sums_layout(per, warps, rows):
    """[BLOCK_O, ROWS] sums in σ order's threads, a thread's PER outputs of a row side by side (one vector store):
    the accumulator's own threads and values, its registers in another order. Its slice along the rows holds a
    thread's PER outputs (warp w, lane 4q + t: w·8·PER + q·PER + 0..PER) as one vector: the scales' layout."""
    regs = [[1 << b, 0] for b in range(per.bit_length() - 1)] + [[0, 1]]
    lanes = [[0, 2], [0, 4]] + [[per << b, 0] for b in range(3)]
    warp_bases = [[8 * per << b, 0] for b in range(warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(regs, lanes, warp_bases, [], [8 * per * warps, rows])


@gluon.jit
def _scales(at, ok, mma: gl.constexpr, SIGMA: gl.constexpr, BLOCK_O: gl.constexpr, WARPS: gl.constexpr):
    """A group's scales (q4: scale-and-offset words) of the block's outputs as the accumulator's rows. SIGMA: loaded
    one vector a thread (a slice of `_sums_layout`), then the index's bits reordered from σ's (w, q, r, h) to the MMA's
    (r, w, h, q) — the values each thread holds are already the ones it needs (asserted: nothing moves); else
    loaded in the accumulator's rows' layout, a word an output."""
    v = gl.load(at, mask=ok, other=0)
    if SIGMA:
        PER: gl.constexpr = BLOCK_O // (8 * WARPS)
        v = gl.permute(gl.reshape(v, [WARPS, 8, PER // 2, 2]), [2, 0, 3, 1])
        v = gl.convert_layout(gl.reshape(v, [BLOCK_O]), gl.SliceLayout(1, mma), assert_trivial=True)
    return v


@gluon.jit
def _group(
    acc,
    w,
    k0,
    k_stop,
    x,
    scales,
    zero,
    ones,
    mma: gl.constexpr,
    GROUP: gl.constexpr,
    FP8: gl.constexpr,
    EVEN: gl.constexpr,
    SIGMA: gl.constexpr,
    BLOCK_O: gl.constexpr,
    WARPS: gl.constexpr,
):
    """One group of inputs of `_dense_rows` (nothing past k_stop): fp8 acc + s·Σ x·v; q4 acc + s·Σ x·(128 + q) +
    (z − 128·s)·Σ x. `x`: the rows' pointers, inputs' places and mask; `scales`: the scales' pointer (q4: the
    scale-and-offset words), its row stride, the outputs (in the accumulator's rows' layout, or SIGMA a slice of
    `_sums_layout`) and their mask."""
    x_cols, x_k, x_ok = x
    s_ptr, stride_s, o_s, o_ok = scales
    at = s_ptr + (k0 // GROUP) * stride_s + o_s  # the group's scales (q4: scale-and-offset words) of the outputs
    ok = o_ok & (k0 < k_stop)
    if FP8:
        s = _scales(at, ok, mma, SIGMA, BLOCK_O, WARPS).to(gl.float32)
        v = gl.inline_asm_elementwise(_FP8_UNPACK, "=r,=r,r", [w], dtype=gl.float16, is_pure=True, pack=4)
        x = _load(x_cols + k0, x_ok, k0, x_k, k_stop, EVEN).to(gl.float16)
        return acc + mma_v2(v, x, zero) * gl.expand_dims(s, 1)
    else:
        # the group's scale and offset of each output, one 32-bit word (QuantWeight.words: the scale's bits low)
        sz = _scales(at, ok, mma, SIGMA, BLOCK_O, WARPS)
        s = sz.to(gl.uint16).to(gl.float16, bitcast=True).to(gl.float32)
        z = (sz >> 16).to(gl.uint16).to(gl.float16, bitcast=True).to(gl.float32) - 128.0 * s
        lo, hi = gl.inline_asm_elementwise(
            _Q4_UNPACK, "=r,=r,=r,=r,r", [w], dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4
        )
        xl = _load(x_cols + k0, x_ok, k0, x_k, k_stop, EVEN).to(gl.bfloat16)  # the group's inputs 0..31
        xh = _load(x_cols + k0 + GROUP // 2, x_ok, k0, x_k, k_stop, EVEN).to(gl.bfloat16)  # and 32..63
        p = mma_v2(hi, xh, mma_v2(lo, xl, zero))  # Σ x·(128 + q) over the group
        sx = mma_v2(ones, xh, mma_v2(ones, xl, zero))  # Σ x, the same in every output's row
        return acc + p * gl.expand_dims(s, 1) + gl.expand_dims(z, 1) * sx


@gluon.jit
def _dense_rows(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    count_ptr,
    N,
    OUT,
    stride_x,
    stride_w,
    stride_s,
    first,
    K: gl.constexpr,
    K_PER_SPLIT: gl.constexpr,
    SPLITS: gl.constexpr,
    GROUP: gl.constexpr,
    FP8: gl.constexpr,
    BLOCK_O: gl.constexpr,
    ROWS: gl.constexpr,
    KW: gl.constexpr,
    WARPS: gl.constexpr,
    UNROLL: gl.constexpr,
    SIGMA: gl.constexpr,
    TILE: gl.constexpr,
    WHOLE_TILES: gl.constexpr,
):
    # the weight [BLOCK_O outputs, WIDTH bytes of a group] is the MMA's first operand, the rows [WIDTH, ROWS] its
    # second; a q4 group's bytes hold its 64 inputs as two nibble halves of 32, an fp8 group's are its 64 inputs.
    # TILE (a tiled weight, engine/quant/dense.py: its outputs the tiled rows first..): a row's group at
    # tile·(TILE·stride_w) + group·(TILE·WIDTH) + place·WIDTH, WHOLE_TILES where each block of outputs is one tile
    # (BLOCK_O = TILE, first a multiple of it: the whole weight, and the slices the model takes); else (TILE 0) at
    # row·stride_w + group·WIDTH
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=KW)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=KW)
    gl.static_assert(UNROLL == 1 or UNROLL == 2 or UNROLL == 4, "UNROLL is 1, 2 or 4")
    gl.static_assert(FP8 or K % GROUP == 0, "q4 groups are whole (engine/quant/dense.py)")
    WIDTH: gl.constexpr = GROUP if FP8 else GROUP // 2
    pid_o = gl.program_id(0)
    pid_m = gl.program_id(1)
    split = gl.program_id(2)
    gl.static_assert(BLOCK_O % (16 * WARPS) == 0, "each warp's rows in whole MMA tiles")
    PER: gl.constexpr = BLOCK_O // (8 * WARPS)  # outputs a thread (SIGMA: side by side)
    local = gl.arange(0, BLOCK_O, layout=gl.SliceLayout(1, a_l))
    if SIGMA:  # the MMA's row i computes output σ(i) (`_sigma`): the weight's rows load in that order
        local = _sigma(local, BLOCK_O, WARPS)
    o_a = pid_o * BLOCK_O + local
    j_a = gl.arange(0, WIDTH, layout=gl.SliceLayout(0, a_l))
    if TILE and WHOLE_TILES:  # the block is the tile first/TILE + pid_o: its rows side by side from one base
        base = w_ptr + (first + pid_o * BLOCK_O).to(gl.int64) * stride_w
        w_rows = base + gl.expand_dims(local * WIDTH, 1) + gl.expand_dims(j_a, 0)
        # every row of a tile is in memory (the last tile's padding, or the next slice's rows): loads untested by row
        w_ok = gl.full([BLOCK_O, 1], 1, gl.int1, layout=a_l)
    elif TILE:
        p = first + o_a.to(gl.int64)  # the output's row among the tiles'
        w_rows = w_ptr + gl.expand_dims((p // TILE) * (TILE * stride_w) + (p % TILE) * WIDTH, 1)
        w_rows = w_rows + gl.expand_dims(j_a, 0)
        w_ok = gl.expand_dims(o_a < OUT, 1)
    else:
        w_rows = w_ptr + gl.expand_dims(o_a.to(gl.int64) * stride_w, 1) + gl.expand_dims(j_a, 0)
        w_ok = gl.expand_dims(o_a < OUT, 1)
    W_STEP: gl.constexpr = TILE if TILE else 1  # a group's bytes apart, over a row's in a group
    j_b = gl.arange(0, WIDTH, layout=gl.SliceLayout(1, b_l))
    r_b = pid_m * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(0, b_l))
    x_cols = x_ptr + gl.expand_dims(r_b.to(gl.int64) * stride_x, 0) + gl.expand_dims(j_b, 1)
    x_ok = gl.expand_dims(r_b < N, 0)
    # the scales' outputs as the sums are stored (SIGMA: a thread's as one vector) or as the accumulator's rows
    sums_l: gl.constexpr = _sums_layout(PER, WARPS, ROWS) if SIGMA else mma
    o_s = pid_o * BLOCK_O + gl.arange(0, BLOCK_O, layout=gl.SliceLayout(1, sums_l))
    o_ok = o_s < OUT
    acc = gl.zeros((BLOCK_O, ROWS), gl.float32, layout=mma)
    zero = gl.zeros((BLOCK_O, ROWS), gl.float32, layout=mma)
    BYTES: gl.constexpr = 1 if FP8 else 2  # inputs a byte (q4: a group's input j and 32 + j)
    EVEN: gl.constexpr = K % GROUP == 0  # q4 always (engine/quant/dense.py)
    if FP8:
        ones = 0  # q4's Σ x alone takes the MMA with ones
    else:
        ones = gl.full((BLOCK_O, WIDTH), 1.0, gl.bfloat16, layout=a_l)
    if EVEN:  # one test a group: the places within a group are not needed
        j_w = 0
        x_k = 0
    else:
        j_w = gl.expand_dims(o_a * 0, 1) + gl.expand_dims(j_a, 0)  # [BLOCK_O, WIDTH]: a byte's place in its group
        x_k = gl.expand_dims(r_b * 0, 0) + gl.expand_dims(j_b, 1)  # [WIDTH, ROWS]: an input's place in its group
    k_start = split * K_PER_SPLIT
    k_stop = gl.minimum(k_start + K_PER_SPLIT, K)
    for step in range(k_start, k_stop, GROUP * UNROLL):
        # the UNROLL (1, 2 or 4) groups' weights loaded before the first is used: more bytes in flight a thread
        w0 = _load(w_rows + step // BYTES * W_STEP, w_ok, step, j_w, k_stop, EVEN)
        if UNROLL > 1:
            k1 = step + GROUP
            w1 = _load(w_rows + k1 // BYTES * W_STEP, w_ok, k1, j_w, k_stop, EVEN)
        if UNROLL > 2:
            k2 = step + 2 * GROUP
            k3 = step + 3 * GROUP
            w2 = _load(w_rows + k2 // BYTES * W_STEP, w_ok, k2, j_w, k_stop, EVEN)
            w3 = _load(w_rows + k3 // BYTES * W_STEP, w_ok, k3, j_w, k_stop, EVEN)
        x = (x_cols, x_k, x_ok)
        scales = (s_ptr, stride_s, o_s, o_ok)
        acc = _group(acc, w0, step, k_stop, x, scales, zero, ones, mma, GROUP, FP8, EVEN, SIGMA, BLOCK_O, WARPS)
        if UNROLL > 1:
            acc = _group(acc, w1, k1, k_stop, x, scales, zero, ones, mma, GROUP, FP8, EVEN, SIGMA, BLOCK_O, WARPS)
        if UNROLL > 2:
            acc = _group(acc, w2, k2, k_stop, x, scales, zero, ones, mma, GROUP, FP8, EVEN, SIGMA, BLOCK_O, WARPS)
            acc = _group(acc, w3, k3, k_stop, x, scales, zero, ones, mma, GROUP, FP8, EVEN, SIGMA, BLOCK_O, WARPS)
    if SIGMA:
        # the sums back in the outputs' order (the index's bits from the MMA's (r, w, h, q) to σ's (w, q, r, h)), in
        # registers: a thread's PER outputs of a row side by side, one vector store (and load, summing slices)
        acc = gl.permute(gl.reshape(acc, [PER // 2, WARPS, 2, 8, ROWS]), [1, 3, 0, 2, 4])
        acc = gl.convert_layout(gl.reshape(acc, [BLOCK_O, ROWS]), sums_l)
    o_m = pid_o * BLOCK_O + gl.arange(0, BLOCK_O, layout=gl.SliceLayout(1, sums_l))
    r_m = pid_m * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(0, sums_l))
    tile = gl.expand_dims(r_m.to(gl.int64) * OUT, 0) + gl.expand_dims(o_m, 1)
    t_ok = gl.expand_dims(r_m < N, 0) & gl.expand_dims(o_m < OUT, 1)
    gl.store(out_ptr + split.to(gl.int64) * N * OUT + tile, acc, mask=t_ok)
    if SPLITS > 1:
        # the tile's slices summed by whichever of its programs finishes last, in slice order (the bits do not
        # depend on which one): every thread's slice stored, then one thread counts it (a release at GPU scope);
        # the program that counts the last sees every slice (acquire), adds them into slice 0's place and sets the
        # count back to 0 for the next launch
        gl.thread_barrier()
        counter = count_ptr + pid_m * gl.num_programs(0) + pid_o
        if gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
            total = gl.load(out_ptr + tile, mask=t_ok, other=0.0, cache_modifier=".cg")
            for s in range(1, SPLITS):
                total += gl.load(out_ptr + s * N * OUT + tile, mask=t_ok, other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + tile, total, mask=t_ok)
            gl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


# the same kernel compiled for any row count (`launch_shape`'s one_row false): Triton otherwise compiles a launch of
# one row (N == 1) on its own
_dense_rows_any = gluon.jit(do_not_specialize=["N"])(_dense_rows.fn)


@functools.cache
def launch_shape(out_features: int, in_features: int, group: int, fp8: bool) -> dict[str, int]:
    """block_o, splits, num_warps, kw, unroll, one_row, sigma for a weight's shape and mode — never for the row count
    (each distinct shape once: the table is cached): blocks of BLOCK_O outputs, the inputs split until the grid has PROGRAMS
    programs (an fp8 LM head: HEAD_PROGRAMS; at most MAX_SPLITS slices, each at least two groups), warps and
    unrolling as the constants above say (fp8, half q4's instructions a byte, loads ahead at every size), unrolling
    only where the inputs hold an even number of groups a slice, rounded down (so a slice of an odd count, e.g. TP=3's
    kda_o_proj, ends on a half-empty step, its loads masked); sigma: the MMA's rows in σ order (`_sigma`): every fp8
    weight, and q4 weights of 32 outputs a warp (the tall ones, 64 a warp, lost 5-10 % at one row in σ); one_row: a
    one-row launch compiled on its own, or the kernel compiled for any row count — an fp8 LM head (whose one-row form
    took 1.3x the 8-row time), and weights of 32 outputs a warp whose slices take at least ANY_ROWS_TURNS loop turns,
    where in σ the one-row compile took 3-20 % longer (docs/BENCHMARKS.md, session 47). PROGRAMS (512) and
    TALL_GROUPS give dsa_q_b (16,384 × 1,536) 4 slices of 6 groups, two a turn, 32 outputs a warp, where 8 slices of
    3, one a turn, 64 a warp took 14-28 % longer at 8 rows (session 47). whole_from: from that many rows (0: never) a
    tiled weight's blocks, each one whole tile, read from one base a block, their loads untested by row — the same
    bits as the per-row form (each row's tile reckoned, what a slice from inside a tile always takes): tall fp8
    weights but the LM head from one row (7-9 % faster on an H100, session 49), tall q4 ones from two (at one row
    5-9 % slower, at 8 rows 3-12 % faster), never the rest (q4 of 32 outputs a warp 8-21 % slower, the others
    within 5 % either way)."""
    blocks = -(-out_features // BLOCK_O)
    head = fp8 and out_features >= HEAD
    programs = HEAD_PROGRAMS if head else PROGRAMS
    splits = 1
    while splits < MAX_SPLITS and blocks * splits < programs and in_features // (2 * splits) >= 2 * group:
        splits *= 2
    groups = -(-in_features // (splits * group))  # a slice's groups
    tall = out_features >= TALL and groups >= TALL_GROUPS  # 64 outputs a warp
    warps = BLOCK_O // (64 if tall else 32)
    whole = in_features // (splits * group) % 2 == 0  # an even number of groups a slice: no half-empty step
    unroll = 2 if (fp8 or blocks * splits < UNROLL_BELOW) and whole else 1
    turns = groups // unroll  # a slice's loop turns (a half-empty last one not counted)
    any_rows = head or (not tall and turns >= ANY_ROWS_TURNS["fp8" if fp8 else "q4"])
    return dict(
        block_o=BLOCK_O,
        splits=splits,
        num_warps=warps,
        kw=KW,
        unroll=unroll,
        one_row=not any_rows,
        sigma=fp8 or not tall,
        whole_from=(1 if fp8 else 2) if tall and not head else 0,
    )


def dense_rows(x: torch.Tensor, weight, tuning: dict | None = None) -> torch.Tensor:
    """x [N, K] (any float type) times a QuantWeight [O, K] -> fp32 [N, O]. `tuning` (bench/dense_bench.py --sweep,
    bench/dense_tiled.py only) overrides the launch (`launch_shape`'s keys)."""
    x = x.contiguous()
    n, k = x.shape
    o, width = weight.shape
    assert k == width, f"rows of {k} inputs for a weight of {width}"
    fp8 = weight.mode == "fp8"
    launch = launch_shape(o, k, weight.group, fp8)
    if tuning:
        launch = {**launch, **tuning}
    splits = launch["splits"]
    per_split = triton.cdiv(triton.cdiv(k, splits), weight.group) * weight.group
    out = torch.empty((splits, n, o), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(o, launch["block_o"]), triton.cdiv(n, ROWS), splits)
    if splits > 1 and grid[0] * grid[1] > COUNTS:
        raise ValueError(f"{grid[0] * grid[1]} tiles of {launch['block_o']} outputs × {ROWS} rows: at most {COUNTS}")
    kernel = _dense_rows if launch["one_row"] else _dense_rows_any
    scales = weight.scale if fp8 else weight.words()  # q4: a group's scale and offset an output, one word
    kernel[grid](
        x, weight.data.view(torch.uint8), scales, out,
        _counts(x.device), n, o, x.stride(0), _row_stride(weight), scales.stride(0), weight.first,
        K=k, K_PER_SPLIT=per_split, SPLITS=splits, GROUP=weight.group, FP8=fp8, BLOCK_O=launch["block_o"],
        ROWS=ROWS, KW=launch["kw"], WARPS=launch["num_warps"], UNROLL=launch["unroll"], SIGMA=launch["sigma"],
        TILE=TILE if weight.tiled else 0, WHOLE_TILES=whole_tiles(launch, n, weight.tiled, weight.first),
        num_warps=launch["num_warps"],
    )  # fmt: skip
    return out[0]


def whole_tiles(launch: dict, rows: int, tiled: bool, first: int = 0) -> bool:
    """Whether `_dense_rows` reads a tiled weight (its rows from `first`) in the form with one base a block at this
    row count: from the table's `whole_from` rows, where each block of outputs is one whole tile."""
    whole_from = launch["whole_from"]
    return tiled and 0 < whole_from <= rows and launch["block_o"] == TILE and first % TILE == 0


def _row_stride(weight) -> int:
    """The bytes from one output's row to the next: a tiled weight's row (its tiles' offsets are reckoned from it),
    else its data's row stride (a row slice's too)."""
    return weight.row_bytes if weight.tiled else weight.data.stride(0)


@functools.cache
def _counts(device: torch.device) -> torch.Tensor:
    """The tiles' slice counters of a device (zero between launches: the last program of a tile resets its own),
    shared by every launch on it: launches that split their inputs must not run at once (one stream). Made on the
    first call and kept; that call must not be inside a graph capture (the zero fill would become a graph node, and
    the memory the graph's): lanes.CapturedStep runs every step eagerly first."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "the dense products' counters are made outside a CUDA graph capture: run a step eagerly first"
        )
    return torch.zeros(COUNTS, dtype=torch.int32, device=device)


@triton.jit
def _dequantize(
    w_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    OUT,
    K,
    stride_w,
    stride_s,
    step_s,
    stride_out,
    first,
    GROUP: tl.constexpr,
    FP8: tl.constexpr,
    BF16: tl.constexpr,
    BLOCK_O: tl.constexpr,
    GROUPS: tl.constexpr,
    TILE: tl.constexpr,
):
    # a program: BLOCK_O outputs × GROUPS groups, as [outputs, groups, a group's bytes]; a q4 group's 32 bytes hold
    # its inputs 0..31 (low nibbles) and 32..63 (high), an fp8 group's 64 its inputs; the scales (and offsets)
    # [outputs, groups, 1], broadcast over a group's bytes
    WIDTH: tl.constexpr = GROUP if FP8 else GROUP // 2
    o = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)[:, None, None]
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)[None, :, None]
    # bytes in runs of 8 a thread, as the bf16 stores take them (16 bytes): the loads and stores share one layout
    j = tl.max_contiguous(tl.arange(0, WIDTH), 8)[None, None, :]
    k = g * GROUP + j  # fp8: the byte's input; q4: its low nibble's
    ok = (o < OUT) & (k < K)  # q4's K is whole groups: the high nibbles' inputs are in too
    if TILE:  # a tiled weight (`_dense_rows`' TILE): the output's row among the tiles' is first + o
        p = first + o.to(tl.int64)
        b = tl.load(
            w_ptr + (p // TILE) * (TILE * stride_w) + g * (TILE * WIDTH) + (p % TILE) * WIDTH + j, mask=ok, other=0
        )
    else:
        b = tl.load(w_ptr + o.to(tl.int64) * stride_w + g * WIDTH + j, mask=ok, other=0)
    g_ok = (o < OUT) & (g * GROUP < K)
    s = tl.load(s_ptr + g * stride_s + o * step_s, mask=g_ok, other=0.0).to(tl.float32)
    out = out_ptr + o.to(tl.int64) * stride_out + k
    if FP8:
        _store(out, b.to(tl.float8e4nv, bitcast=True).to(tl.float32) * s, ok, BF16)
    else:
        z = tl.load(z_ptr + g * stride_s + o * step_s, mask=g_ok, other=0.0).to(tl.float32)
        _store(out, (b & 15).to(tl.float32) * s + z, ok, BF16)
        _store(out + GROUP // 2, (b >> 4).to(tl.float32) * s + z, ok, BF16)


@triton.jit
def _store(ptrs, v, ok, BF16: tl.constexpr):
    """fp32 values stored as fp32 or, BF16, rounded to nearest even (`_round_bf16`)."""
    if BF16:
        tl.store(ptrs, _round_bf16(v), mask=ok)
    else:
        tl.store(ptrs, v, mask=ok)


@triton.jit
def _round_bf16(v):
    """fp32 values rounded to bf16, to nearest even in integer steps: torch's rounding of finite values, the same in
    Triton's CPU interpreter (whose cast to bf16 truncates); a NaN stays a NaN (the quiet one)."""
    bits = tl.where(v != v, 0x7FC00000, v.to(tl.uint32, bitcast=True))
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


def dequantized(weight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A QuantWeight [O, K] as a new `dtype` (bf16 or fp32) tensor on its device, one launch: the bits of
    `weight.dequantize(dtype)`. The weight may be a row slice (`QuantWeight.rows`: strided views)."""
    assert dtype in (torch.bfloat16, torch.float32), f"dequantised to bf16 or fp32, not {dtype}"
    data = weight.data.view(torch.uint8)
    offset = weight.scale if weight.offset is None else weight.offset
    assert data.stride(-1) == 1 and weight.scale.stride() == offset.stride(), "a weight's rows unit-strided"
    o, k = weight.shape
    out = torch.empty((o, k), dtype=dtype, device=data.device)
    grid = (triton.cdiv(o, DEQUANT_O), triton.cdiv(triton.cdiv(k, weight.group), DEQUANT_GROUPS))
    _dequantize[grid](
        data, weight.scale, offset, out, o, k, _row_stride(weight), *weight.scale.stride(), out.stride(0),
        weight.first, GROUP=weight.group, FP8=weight.mode == "fp8", BF16=dtype == torch.bfloat16, BLOCK_O=DEQUANT_O,
        GROUPS=DEQUANT_GROUPS, TILE=TILE if weight.tiled else 0, num_warps=DEQUANT_WARPS, enable_fp_fusion=False,
    )  # fmt: skip
    return out
