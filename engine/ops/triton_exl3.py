"""EXL3 experts on the GPU: multiply a few rows by EXL3 matrices, decoding the trellis in registers.

The format and its conventions are engine/quant/exl3.py's (the CPU reference this is tested against). A layer is
y = H(H(x ⊙ suh) · W_q) ⊙ svh + bias, H the 128-block Hadamard rotation. Here:

- `_rotate` applies suh, the Hadamard rotation and the kernel's input order to each row (one launch), and
  `_rotate` again sums the split-K partials in a fixed order, rotates back and applies svh and the bias: both use
  exl3.rotate's butterflies in its order (the same fp32 bits) and are elementwise per row;
- `_exl3_gemv` multiplies the rotated rows by W_q without writing W_q anywhere: each program owns BNT output tiles
  of one matrix (an expert's projection, chosen by an id read on the device: no host sync, the launch shape depends
  only on the number of (row group, matrix) pairs) and one of SPLIT runs of K tiles, walks its K tiles KU at a time
  (unrolled, so their loads are in flight together), and decodes each 16×16 tile from its 16·bits trellis words
  straight into registers.

`_exl3_gemv_mma` is the same product on the tensor cores (the "mma" form of `exl3_gemv_parts`; Gluon, compiled CUDA
only): each decoded tile is `mma.sync`'s A operand where it was decoded (the format lays tiles out as MMA
fragments), the rows, in their natural order, the B operand as fp16 head and remainder. It spends no FMA a weight a
row, so 4 and 8 rows an expert cost about what one does (H200: 0.69-0.72x and 0.50x the FMA form's time at 4 and 8
rows), but at one row an expert — every (row, expert) pair the served MoE launches — it is not faster (0.99-1.06x
the FMA form's time; the released depth's decode step the same at batch 1, 1.8 % slower at batch 4): both
forms spend ~6-7 instructions a value on the decode (the state's shifts and masks, the hash, its mask-and-flip, the
halves' add; the tensor-core form packs two fp16 values with a byte permute where the FMA form converts each to fp32
and multiplies), which limits both well below the memory rate (no hardware counters here to say which pipe). So
the engine runs the FMA form (`GEMV_LAUNCH`, `gemv_form`), and the MMA form is there for rows that share an expert
(bench/exl3_gemv_bench.py, docs/BENCHMARKS.md, session 24).

Decoding in the kernel's layout. A tile's 256 values come in the order of the MMA fragments: "lane" l (0..31) holds
values p = 8l + j, j = 0..7; value (l, j) belongs to input row r = 2(l%4) + (j&1) + 8((j>>1)&1) and output column
c = l//4 + 8(j>>2) of the tile (exl3.tile_cells). So the kernel keeps a [.., 8 (l//4), 4 (l%4)] grid of lanes and, for
each j, one decoded value per lane: the input it multiplies depends only on (l%4, j&3), the output column only on
(l//4, j>>2). The wrapper permutes each 16-input tile of the rotated rows into (j&3, l%4) order, so the kernel
loads 4 contiguous inputs per row per j; products accumulate per lane in two halves (j < 4: columns 0..7, j >= 4:
columns 8..15), and the four lanes of a column (l%4) are added at the end in a fixed order. All of it in one
register layout (see `_exl3_gemv`): no shared-memory traffic in the loop. Every sum is an elementwise add in an order
fixed by the code, whatever the number of rows: a row's result is the same bits alone or in a batch of 8.

- 4-bit tiles (the served checkpoint's routed experts) hold one 32-bit word per lane: lane l's eight 16-bit states
  end at its own word's nibbles, the first three reaching into word l-1, so two loads per tile give them all
  (`DENSE4`). Any other width reads, for each value, the two words its 16-bit window spans (cached loads).
- The codebooks are computed inline (exl3.codebook's definition): 3inst / mcg hash the state with a 32-bit
  multiply(-add), mask and flip, then add the word's two fp16 halves (exact in fp32, one rounding to fp16); mul1 sums
  the hash's four bytes and scales them by fp16 constants in one exact fp32 multiply-add, rounded once to fp16. W_q's
  values are therefore the reference's, bit for bit (`exl3_unpack` checks it); products and sums are fp32.

Prompt chunks (many rows) of a single matrix (`exl3_linear`): `exl3_unpack` decodes it whole to its exact fp16 W_q
with the same decoder and the matmul runs in torch (fp32 activations × W_q); W_q is transient.

The MoE (`routed_experts`, used by moe.MoE when a CUDA checkpoint's routed experts are EXL3): each (row, expert) pair
is one row through gate and up (matrices 2e, 2e+1 of the gate/up bank, one GEMV launch for all) and through down,
expert ids read on the device, in five launches: `_rotate` (x for gate and up), the GEMV, `_swiglu_between`
(split-K sums, output rotations, SwiGLU, down's input rotation), the GEMV, `_weighted_sum` (output rotation, routing
weights, the row's k pairs added). Launch shapes depend on the pair count only and the split-K on the matrix only,
so a row's bits never depend on the batch.

More than PAIRS_MAX pairs (a prompt chunk: `grouped_experts`): the pairs are sorted by expert once (on the device),
cut into blocks of at most BM pairs of one expert, and `_exl3_grouped` multiplies each block by its expert's W_q on
the tensor cores, decoding each K tile of the trellis once for the block's rows straight into the MMA operand
(`_tile_fragment`): W_q never reaches memory and nothing waits on the host. The MMA's operands are fp16 (W_q's
values are fp16: exact) or, as an option, TF32; each activation is split into its rounding to the operand type and
the remainder, two products, so the sums are close to fp32 (from the expert loop's fp32 matmuls at the served
shapes, H200: 2.5e-5 of the largest output with fp16 operands, 4.9e-5 with TF32). The same rotations,
`_swiglu_between` and `_weighted_sum` as the decode path; a token's bits do not depend on the chunk's other tokens.
On Hopper (compute capability 9.0) the product is `_exl3_grouped_wgmma` instead, a Gluon kernel: the format's tile
layout is the MMA's A fragment, so the product is computed transposed (outputs × pairs) and each decoded W_q tile is
the warpgroup MMA's register operand as it stands, where `_exl3_grouped`'s tl.dot stored it to shared memory
(21-way bank conflicts); its x rows come in their natural input order, as the two fp16 operands the rotation and
`_swiglu_between` write for it (`_store_halves`: each program split x again at every K step before), copied into
shared memory by cp.async, and its MMAs are asynchronous: a tile's decode overlaps the tile before's products. Both
grids put a pair block's output blocks side by side, so they read the block's x rows from L2. H200, 2,048 tokens
through one GLM-5.3-Flash layer's routed experts at TP=2's shard: 3.91 ms (session 22; 6.58 with the dot form blocks
first, as in session 21; bf16 experts' `_grouped_mm` 3.75; the loop over experts it replaced, `_looped_experts`,
kept for the bench, 176 ms); H100, the asynchronous form: 3.80 -> 3.28 ms, the same bits (session 42).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from engine.quant import exl3

CODEBOOK_ID = {"3inst": 0, "mcg": 1, "mul1": 2}
# what the routed sum may add to each row, in `_weighted_sum`: the shared expert's output [rows, H] fp32, or a call
# giving it (a stream join, made just before the sum's launch)
Addend = torch.Tensor | Callable[[], torch.Tensor] | None
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# `_store_halves`' remainder as one uncontracted PTX subtraction (compiled), a plain one (Triton's interpreter, which
# runs no PTX and contracts nothing)
_SUB_RN = tl.constexpr(not _INTERPRETED)
MAX_ROWS = 8  # rows per matrix in one launch (decode and verify windows)
# how `rotate_rows` stores each 16-input tile: as is, in the GEMV's input order, in the grouped MMA's
INPUT_ORDERS = {"natural": 0, "gemv": 1, "mma": 2}
LAST_LAUNCH: dict = {}  # the last compiled GEMV (registers, spills: bench/exl3_bench.py)
SPLIT_TILES = 16  # K tiles a program when the split is not given (K=4096: 16 runs)
LAUNCH_DEFAULTS: dict = {}  # form / block_n_tiles / split / unroll / num_warps / asm when a call gives none
# the decode GEMV's forms, each with its launch when none is given: "fma" (`_exl3_gemv`, fp32 FMAs: what the engine
# runs, and the interpreter's) and "mma" (`_exl3_gemv_mma`, the tensor cores; compiled CUDA of compute capability 8.0
# on). H200 (bench/exl3_gemv_bench.py, docs/BENCHMARKS.md, session 24): at one row an expert — every (row, expert)
# pair of the served MoE — the mma form takes 0.99-1.06x the fma form's time (both limited by the decode's ~6-7
# instructions a value), and the released depth's graphed decode step 8.35 / 13.19 ms at batch 1 / 4 against
# 8.36 / 12.96; with 4 and 8 rows an expert it takes 0.69-0.72x and 0.50x. The mma launch: the sweep's best, or
# within 1 %, at 8 and 32 pairs of one row and 8 experts of 4 rows (TP=2's shard). LAUNCH_DEFAULTS' options apply to
# either form (a bench's override; an mma launch its layout cannot take is refused, not changed)
GEMV_FORMS = ("fma", "mma")
GEMV_LAUNCH = {
    "fma": {"unroll": 2, "num_warps": 4},  # block_n_tiles: `_config`'s choice by rows and format
    "mma": {"block_n_tiles": 16, "unroll": 1, "num_warps": 2},
}


def _fp16_value(bits: int) -> float:
    return float(torch.tensor(bits, dtype=torch.int16).view(torch.float16).item())


_MUL1_SCALE = _fp16_value(exl3._MUL1_SCALE)
_MUL1_BIAS = _fp16_value(exl3._MUL1_BIAS - 65536)

# position 4 (j&3) + l%4 -> input row in the tile: the order the kernel reads a tile's 16 inputs in
_INPUT_ORDER = [2 * (q % 4) + (q // 4 & 1) + 8 * ((q // 4) >> 1) for q in range(16)]


@triton.jit
def _decode(
    state,
    CODEBOOK: tl.constexpr,
    MUL1_SCALE: tl.constexpr,
    MUL1_BIAS: tl.constexpr,
    ASM: tl.constexpr,
    F16: tl.constexpr = False,
):
    """The fp16 value of uint32 states 0..65535 in codebook 0 = 3inst, 1 = mcg, 2 = mul1, returned as fp32 (exact;
    F16: as the fp16 itself, for fp16 tensor-core operands).
    ASM (compiled kernels; the interpreter cannot run PTX): 3inst / mcg's mask-and-flip as one lop3, the two halves
    added by one f16 add straight from the 32-bit register: the same operations as the Triton form below, in the
    fewest instructions (the decode is the GEMV's cost: see `_exl3_gemv`)."""
    if CODEBOOK == 2:
        x = state * 0x83DCD12D
        byte_sum = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)
        # 2^23 + (1024 + byte_sum) as fp32 bits, less 2^23: the integer as fp32 without a conversion
        count = (0x4B000400 + byte_sum).to(tl.float32, bitcast=True) - 8388608.0
        value = (count * MUL1_SCALE + MUL1_BIAS).to(tl.float16)  # one rounding
    else:
        if CODEBOOK == 1:
            x = state * 0xCBAC1FED
        else:
            x = state * 89226354 + 64248484
        if ASM:
            # lut 0x6A = (a & b) ^ c; {lo, hi} are the word's fp16 halves; add.rn.f16 rounds the exact sum once
            value = tl.inline_asm_elementwise(
                """{
                .reg .b32 t;
                .reg .b16 lo, hi;
                lop3.b32 t, $1, 0x8FFF8FFF, 0x3B603B60, 0x6A;
                mov.b32 {lo, hi}, t;
                add.rn.f16 $0, lo, hi;
                }""",
                "=h,r",
                [x],
                dtype=tl.float16,
                is_pure=True,
                pack=1,
            )
        else:
            x = (x & 0x8FFF8FFF) ^ 0x3B603B60
            low = (x & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
            high = (x >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
            value = low + high  # an fp16 add rounds the exact sum once, as the format's fp32 sum
    return value if F16 else value.to(tl.float32)  # exact


@triton.jit
def _tile_words(base, lane_words, FAST4: tl.constexpr):
    """The 4-bit fast path's two coalesced loads: each lane's word and its predecessor (circular); unused else."""
    if FAST4:
        cur = tl.load(base + lane_words).to(tl.uint32, bitcast=True)
        prev = tl.load(base + (lane_words + 31) % 32).to(tl.uint32, bitcast=True)
    else:
        cur = 0
        prev = 0
    return cur, prev


@triton.jit
def _tile_values(
    base,
    quad,
    lane4,
    j: tl.constexpr,
    WORDS: tl.constexpr,
    BITS2: tl.constexpr,
    DENSE4: tl.constexpr,
    cur,
    prev,
    CODEBOOK: tl.constexpr,
    MUL1_SCALE: tl.constexpr,
    MUL1_BIAS: tl.constexpr,
    ASM: tl.constexpr,
    F16: tl.constexpr = False,
):
    """Value j of every lane of the tiles at `base` (int32 word pointers, broadcast against quad = l // 4 and
    lane4 = l % 4), as fp32 (exact fp16 values; F16: fp16)."""
    if DENSE4:
        # lane l's state j spans stream bits 32l + 4j - 12 .. 32l + 4j + 4: the low bits of word l-1 when j < 3.
        # Odd j end on a byte boundary of `cur`, even j >= 2 on one of `mid` (the stream 4 bits later: one funnel
        # shift a tile), so each is one shift, byte permute or mask
        if j < 2:
            state = ((cur >> (28 - 4 * j)) | (prev << (4 + 4 * j))) & 0xFFFF
        elif j % 2 == 0:
            mid = (cur >> 4) | (prev << 28)
            state = (mid >> (24 - 4 * j)) & 0xFFFF
        else:
            state = (cur >> (28 - 4 * j)) & 0xFFFF
    else:
        step = (4 * quad + lane4) * 8 + j + 1  # p + 1, [8, 4]
        end = (step * BITS2 - (step % 2) * (BITS2 % 2)) // 2  # exl3.window_ends
        start = end - 16 + WORDS * 32
        first = (start // 32) % WORDS
        offset = (start % 32).to(tl.uint32)
        lead = tl.load(base + first).to(tl.uint32, bitcast=True)
        follow = tl.load(base + (first + 1) % WORDS).to(tl.uint32, bitcast=True)
        state = ((lead << offset) | ((follow >> 1) >> (31 - offset))) >> 16
    return _decode(state, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)


@triton.jit
def _lane_sum(acc, ROWS: tl.constexpr, BNT: tl.constexpr):
    """[ROWS, 4 (l % 4), 8, BNT] -> [ROWS, 8, BNT]: ((l0 + l1) + l2) + l3 (l % 4 = 2a + b)."""
    t = tl.permute(acc, (0, 2, 3, 1))  # [ROWS, 8, BNT, 4]
    even, odd = tl.split(tl.reshape(t, [ROWS, 8, BNT, 2, 2]))  # b = 0 / b = 1
    l0, l2 = tl.split(even)
    l1, l3 = tl.split(odd)
    return ((l0 + l1) + l2) + l3


@triton.jit
def _gemv_program(mat_ptr, PAIRED: tl.constexpr):
    """A decode-GEMV program's (group, output block, K run, groups, matrix): matrix mats[group], or with PAIRED
    2 mats[group // 2] + group % 2 (an expert's gate and up)."""
    group = tl.program_id(0)
    groups = tl.num_programs(0)
    if PAIRED:
        mat = 2 * tl.load(mat_ptr + group // 2).to(tl.int64) + group % 2
    else:
        mat = tl.load(mat_ptr + group).to(tl.int64)
    return group, tl.program_id(1), tl.program_id(2), groups, mat


@triton.jit
def _exl3_gemv(
    x_ptr,
    t_ptr,
    mat_ptr,
    out_ptr,
    K_TILES: tl.constexpr,
    N_TILES: tl.constexpr,
    WORDS: tl.constexpr,
    BITS2: tl.constexpr,
    CODEBOOK: tl.constexpr,
    ROWS: tl.constexpr,
    BNT: tl.constexpr,
    SPLIT: tl.constexpr,
    KU: tl.constexpr,
    MUL1_SCALE: tl.constexpr,
    MUL1_BIAS: tl.constexpr,
    ASM: tl.constexpr,
    PAIRED: tl.constexpr,
):
    """part[s, g, m, :] = xp[g, m, K_s] @ W_q[mats[g]][K_s, :] (PAIRED: mats[g] = 2 ids[g // 2] + g % 2) for m < ROWS, K_s the s-th of SPLIT runs of K tiles;
    xp in the kernel's input order (module docstring). KU tiles a step, unrolled (their loads issue together).

    Every tensor is 4-D [ROWS or 1, 4 (l % 4), 8 (l // 4), BNT] and the loaded words, decoded values and products
    share one register layout: the word offsets of `cur` and `prev` are both taken modulo 32, which gives them the
    same layout (a mixed one costs a shared-memory round trip with barriers per value, what made the first version
    of this kernel slow), and it puts a tile's 32 lanes on a warp's 32 threads (one 128-byte load a tile) and a
    thread's BNT/warps tiles in its registers, so one input value serves them all."""
    group, block, split, groups, mat = _gemv_program(mat_ptr, PAIRED)

    rows = tl.arange(0, ROWS)[:, None, None, None]
    lane4 = tl.arange(0, 4)[None, :, None, None]  # l % 4
    quad = tl.arange(0, 8)[None, None, :, None]  # l // 4
    tiles = (block * BNT + tl.arange(0, BNT))[None, None, None, :]
    prev_words = (4 * quad + lane4 + 31) % 32  # word l-1, circular
    lane_words = (prev_words + 1) % 32  # word l (the same layout as prev_words)
    first_tile = split * (K_TILES // SPLIT)
    t_base = t_ptr + (mat * (K_TILES * N_TILES) + first_tile * N_TILES) * WORDS
    tile_words = tiles * WORDS  # [1, 1, 1, BNT]
    x_base = x_ptr + group.to(tl.int64) * (ROWS * K_TILES * 16) + first_tile * 16
    x_offs = rows * (K_TILES * 16) + lane4  # [ROWS, 4, 1, 1]

    acc_lo = tl.zeros([ROWS, 4, 8, BNT], dtype=tl.float32)
    acc_hi = tl.zeros([ROWS, 4, 8, BNT], dtype=tl.float32)
    for kt0 in range(0, K_TILES // SPLIT, KU):
        for u in tl.static_range(KU):
            kt = kt0 + u
            base = t_base + kt * (N_TILES * WORDS) + tile_words  # [1, 1, 1, BNT]
            if BITS2 == 8:
                cur = tl.load(base + lane_words).to(tl.uint32, bitcast=True)
                prev = tl.load(base + prev_words).to(tl.uint32, bitcast=True)
            else:
                cur = 0
                prev = 0
            for j in tl.static_range(8):
                w = _tile_values(
                    base, quad, lane4, j, WORDS, BITS2, BITS2 == 8, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM
                )
                x = tl.load(x_base + kt * 16 + (j & 3) * 4 + x_offs)  # [ROWS, 4, 1, 1]
                if j < 4:
                    acc_lo += w * x
                else:
                    acc_hi += w * x

    # add the four lanes of each column (l % 4 = 0, 1, 2, 3, in that order), then store columns 0..7 and 8..15
    cols = tl.arange(0, 8)[None, :, None] + ((block * BNT + tl.arange(0, BNT)) * 16)[None, None, :]
    out_rows = out_ptr + ((split * groups + group) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None, None] * (
        N_TILES * 16
    )
    tl.store(out_rows + cols, _lane_sum(acc_lo, ROWS, BNT))
    tl.store(out_rows + cols + 8, _lane_sum(acc_hi, ROWS, BNT))


@gluon.jit
def _mma_tile(
    acc, t_base, kt, step_words, quad, lane4, cur, prev, x_ptrs, x_ok, a_l: gl.constexpr, DECODE: gl.constexpr
):
    """`_exl3_gemv_mma`'s K tile kt: its BNT tiles decoded into the A operand, the rows' x as fp16 head and remainder,
    two products into acc."""
    WORDS, BITS2, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, BNT = DECODE
    base = t_base + kt * step_words
    w = _tile_fragment(
        base, quad, lane4, cur, prev, WORDS, BITS2, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, BNT, True, True
    )
    w = gl.convert_layout(w, a_l, assert_trivial=True)
    x = gl.load(x_ptrs + kt * 16, mask=x_ok, other=0.0)
    head = x.to(gl.float16)
    acc = mma_v2(w, head, acc)
    return mma_v2(w, (x - head.to(gl.float32)).to(gl.float16), acc)


@gluon.jit
def _exl3_gemv_mma(
    x_ptr,
    t_ptr,
    mat_ptr,
    out_ptr,
    K_TILES: gl.constexpr,
    N_TILES: gl.constexpr,
    WORDS: gl.constexpr,
    BITS2: gl.constexpr,
    CODEBOOK: gl.constexpr,
    ROWS: gl.constexpr,
    BNT: gl.constexpr,
    SPLIT: gl.constexpr,
    KU: gl.constexpr,
    MUL1_SCALE: gl.constexpr,
    MUL1_BIAS: gl.constexpr,
    ASM: gl.constexpr,
    PAIRED: gl.constexpr,
    WARPS: gl.constexpr,
):
    """`_exl3_gemv` on the tensor cores (`mma.sync` m16n8k16, Gluon): the same partials part[s, g, m, :] from xp in
    its natural input order, the product transposed, partᵀ [16 BNT outputs, 8 rows] += W_qᵀ · xpᵀ. A tile's values
    are the MMA's A fragment as the format lays them out (`_exl3_grouped_wgmma`), so each decoded tile is the first
    operand where it was decoded (the conversion is checked trivial at compile time); the rows (up to 8, the rest
    masked to zero) are the second, as the fp16 rounding of each x and the fp16 of its remainder, two products (what
    `_exl3_grouped` does with F16: fp32-close sums, fp16's range). Where `_exl3_gemv` spends an FMA a weight a row
    and converts each decoded fp16 to fp32, here the decode is the work, whatever the row count.

    Bytes in flight: at one row a step's loads are a few hundred bytes a warp and each waits a memory latency, so
    the words of the next KU tiles (1, 2 or 4) are loaded while this step's KU are decoded and multiplied, held in
    registers. Tiles in K order; a row's bits depend on the launch (SPLIT by the matrix) alone."""
    gl.static_assert(KU == 1 or KU == 2 or KU == 4, "KU is 1, 2 or 4")
    words: gl.constexpr = gl.BlockedLayout([1, 1, 1], [4, 1, 8], [1, WARPS, 1], [0, 2, 1])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    DECODE: gl.constexpr = (WORDS, BITS2, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, BNT)
    D4: gl.constexpr = BITS2 == 8
    group, block, split, groups, mat = _gemv_program(mat_ptr, PAIRED)
    lane4 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, words))), 1), 2)
    tiles = block * BNT + gl.arange(0, BNT, layout=gl.SliceLayout(0, gl.SliceLayout(2, words)))
    tiles = gl.expand_dims(gl.expand_dims(tiles, 0), 2)
    quad = gl.expand_dims(gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, words))), 0), 1)
    STEPS: gl.constexpr = K_TILES // SPLIT
    first_tile = split * STEPS
    t_base = t_ptr + (mat * (K_TILES * N_TILES) + first_tile * N_TILES) * WORDS + tiles * WORDS
    lane_words = 4 * quad + lane4
    sw = N_TILES * WORDS
    k_b = gl.arange(0, 16, layout=gl.SliceLayout(1, b_l))
    r_b = gl.arange(0, 8, layout=gl.SliceLayout(0, b_l))
    x_ptrs = (
        x_ptr
        + group.to(gl.int64) * (ROWS * K_TILES * 16)
        + first_tile * 16
        + gl.expand_dims(r_b * (K_TILES * 16), 0)
        + gl.expand_dims(k_b, 1)
    )
    x_ok = gl.expand_dims(r_b < ROWS, 0) & gl.expand_dims(k_b < 16, 1)
    acc = gl.zeros([16 * BNT, 8], gl.float32, layout=mma)
    # the first step's words; then each step loads the next step's before its own are decoded
    c0, p0 = _tile_words(t_base, lane_words, D4)
    c1, p1, c2, p2, c3, p3 = 0, 0, 0, 0, 0, 0
    if KU > 1:
        c1, p1 = _tile_words(t_base + sw, lane_words, D4)
    if KU > 2:
        c2, p2 = _tile_words(t_base + 2 * sw, lane_words, D4)
        c3, p3 = _tile_words(t_base + 3 * sw, lane_words, D4)
    for kt in range(0, STEPS, KU):
        ahead = gl.minimum(kt + KU, STEPS - KU)  # the last step loads its own words again (cached), unused
        n0, q0 = _tile_words(t_base + ahead * sw, lane_words, D4)
        n1, q1, n2, q2, n3, q3 = 0, 0, 0, 0, 0, 0
        if KU > 1:
            n1, q1 = _tile_words(t_base + (ahead + 1) * sw, lane_words, D4)
        if KU > 2:
            n2, q2 = _tile_words(t_base + (ahead + 2) * sw, lane_words, D4)
            n3, q3 = _tile_words(t_base + (ahead + 3) * sw, lane_words, D4)
        acc = _mma_tile(acc, t_base, kt, sw, quad, lane4, c0, p0, x_ptrs, x_ok, a_l, DECODE)
        if KU > 1:
            acc = _mma_tile(acc, t_base, kt + 1, sw, quad, lane4, c1, p1, x_ptrs, x_ok, a_l, DECODE)
        if KU > 2:
            acc = _mma_tile(acc, t_base, kt + 2, sw, quad, lane4, c2, p2, x_ptrs, x_ok, a_l, DECODE)
            acc = _mma_tile(acc, t_base, kt + 3, sw, quad, lane4, c3, p3, x_ptrs, x_ok, a_l, DECODE)
        c0, p0, c1, p1, c2, p2, c3, p3 = n0, q0, n1, q1, n2, q2, n3, q3
    cols = block * (16 * BNT) + gl.arange(0, 16 * BNT, layout=gl.SliceLayout(1, mma))
    m = gl.arange(0, 8, layout=gl.SliceLayout(0, mma))
    out_rows = ((split * groups + group) * ROWS + m).to(gl.int64) * (N_TILES * 16)
    ok = gl.expand_dims(m < ROWS, 0) & gl.expand_dims(cols >= 0, 1)
    gl.store(out_ptr + gl.expand_dims(out_rows, 0) + gl.expand_dims(cols, 1), acc, mask=ok)


@triton.jit
def _rotate(
    in_ptr,
    out_ptr,
    mat_ptr,
    pre_ptr,
    post_ptr,
    add_ptr,
    live_rows,
    share,
    gather_ptr,
    total,
    WIDTH: tl.constexpr,
    ROWS: tl.constexpr,
    PARTS: tl.constexpr,
    PRE: tl.constexpr,
    POST: tl.constexpr,
    ADD: tl.constexpr,
    ORDER: tl.constexpr,
    PAIRED: tl.constexpr,
    GATHER: tl.constexpr,
    R: tl.constexpr = 1,
    SPLIT: tl.constexpr = False,
):
    """One 128-block of R rows r = g*ROWS + m (of `total`): out = H(sum of PARTS partials · pre[mats[g]]) ·
    post[mats[g]] (+ add[mats[g]]), H by the butterflies of exl3.rotate in its order (same fp32 bits, whatever R);
    rows m >= live_rows are written as zeros; ORDER 1 / 2 stores each 16-tile in the GEMV's / the grouped MMA's
    input order. Output row r reads input row r // share (one input row feeding `share` matrices), or row
    gather[r // share] (GATHER; one part). SPLIT: out is fp16 [2, total, WIDTH], each value as `_store_halves`
    writes it."""
    row = tl.program_id(0) * R + tl.arange(0, R)
    block = tl.program_id(1)
    valid = row < total
    in_rows = total // share
    if GATHER:
        in_row = tl.load(gather_ptr + row // share, mask=valid, other=0).to(tl.int64)
    else:
        in_row = (row // share).to(tl.int64)
    if PAIRED:  # matrix 2 ids[g // 2] + g % 2
        mat = 2 * tl.load(mat_ptr + row // ROWS // 2, mask=valid, other=0).to(tl.int64) + (row // ROWS) % 2
    else:
        mat = tl.load(mat_ptr + row // ROWS, mask=valid, other=0).to(tl.int64)
    live = ((row % ROWS) < live_rows)[:, None]
    offs = block * 128 + tl.arange(0, 128)
    mask = valid[:, None]
    y = tl.zeros([R, 128], dtype=tl.float32)
    for part in tl.static_range(PARTS):
        y += tl.load(in_ptr + (part * in_rows + in_row)[:, None] * WIDTH + offs[None, :], mask=mask, other=0.0)
    mat_offs = mat[:, None] * WIDTH + offs[None, :]
    if PRE:
        y = y * tl.load(pre_ptr + mat_offs, mask=mask, other=0.0).to(tl.float32)
    y = _hadamard_rows(y, R)
    if POST:
        y = y * tl.load(post_ptr + mat_offs, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        y = y + tl.load(add_ptr + mat_offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.where(live, y, 0.0)
    dest = _kernel_order(block, ORDER)
    half = tl.cast(total, tl.int64) * WIDTH  # past 2^31 values at 32k-token chunks
    _store_halves(out_ptr, row.to(tl.int64)[:, None] * WIDTH + dest[None, :], half, y, mask, SPLIT)


@triton.jit
def _store_halves(out_ptr, offs, half, y, mask, SPLIT: tl.constexpr):
    """fp32 y at out_ptr + offs, or (SPLIT) as the grouped products' two fp16 operands: y rounded to fp16 at offs and
    the remainder y - head rounded to fp16 `half` values further — the split those kernels made of each x in every
    program and every K step, made once here, the same bits. The subtraction is `sub.rn.f32` in PTX: written as
    y - head, the compiler fused it with the product that made y (the Hadamard's last scaling) into one FMA, a
    remainder off in its last bit for ~1 value in 6, where the products read y from memory."""
    if SPLIT:
        head = y.to(tl.float16)
        tl.store(out_ptr + offs, head, mask=mask)
        wide = head.to(tl.float32)
        if _SUB_RN:
            rest = tl.inline_asm_elementwise(
                "sub.rn.f32 $0, $1, $2;", "=r,r,r", [y, wide], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            rest = y - wide
        tl.store(out_ptr + half + offs, rest.to(tl.float16), mask=mask)
    else:
        tl.store(out_ptr + offs, y, mask=mask)


@triton.jit
def _hadamard(y):
    """H of one 128-block, by the butterflies of exl3.rotate in its order (the same fp32 bits)."""
    for stage in tl.static_range(7):
        pairs = tl.permute(tl.reshape(y, [64 >> stage, 2, 1 << stage]), (0, 2, 1))
        a, b = tl.split(pairs)
        y = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), [128])
    return y * 0.08838834764831845  # 1 / sqrt(128), as exl3.rotate


@triton.jit
def _hadamard_rows(y, R: tl.constexpr):
    """H of the 128-blocks of [R, 128], each by `_hadamard`'s butterflies (the same fp32 bits a row)."""
    for stage in tl.static_range(7):
        halves = tl.permute(tl.reshape(y, [R, 64 >> stage, 2, 1 << stage]), (0, 1, 3, 2))
        a, b = tl.split(halves)
        y = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), [R, 128])
    return y * 0.08838834764831845


@triton.jit
def _kernel_order(block, ORDER: tl.constexpr):
    """Where each input of 128-block `block` goes in the INPUT_ORDERS order ORDER: as is (0), the GEMV's input order
    (1: each 16-tile as (j&3, l%4)) or the grouped MMA's (2: each 16-tile as (l%4, j>>1 & 1, j&1),
    `_tile_fragment`)."""
    k = tl.arange(0, 128) % 16  # input row in the tile: 2 (l%4) + (j&1) + 8 (j>>1 & 1)
    if ORDER == 2:
        place = 4 * ((k % 8) // 2) + 2 * (k >> 3) + (k & 1)
    elif ORDER == 1:
        place = 4 * ((k & 1) + 2 * (k >> 3)) + (k % 8) // 2
    else:
        place = k
    return block * 128 + (tl.arange(0, 128) // 16) * 16 + place


@triton.jit
def _parts_sum(in_ptr, row, rows, offs, WIDTH: tl.constexpr, PARTS: tl.constexpr):
    """Σ over PARTS split-K partials [PARTS, rows, WIDTH] of row `row` at `offs`, in part order."""
    y = tl.zeros([128], dtype=tl.float32)
    for part in tl.static_range(PARTS):
        y += tl.load(in_ptr + (part * rows + row).to(tl.int64) * WIDTH + offs)
    return y


@triton.jit
def _swiglu_between(
    parts_ptr,
    out_ptr,
    expert_ptr,
    svh_ptr,
    suh_ptr,
    limit,
    WIDTH: tl.constexpr,
    PARTS: tl.constexpr,
    ORDER: tl.constexpr,
    SPLIT: tl.constexpr = False,
):
    """Between the MoE's two GEMVs, one 128-block of pair p: gate / up = H(Σ partials of rows 2p / 2p+1) · svh,
    h = silu(min(gate, limit)) · clamp(up, ±limit), out = H(h · suh_down[expert]), each 16-tile stored in the
    INPUT_ORDERS order ORDER (the GEMV's, the grouped MMA's or as is); SPLIT: as `_store_halves`' two fp16
    operands, out [2, pairs, WIDTH]."""
    pair = tl.program_id(0)
    block = tl.program_id(1)
    rows = 2 * tl.num_programs(0)
    offs = block * 128 + tl.arange(0, 128)
    expert = tl.load(expert_ptr + pair).to(tl.int64)
    gate_mat = 2 * expert  # the gate/up bank's matrices 2e, 2e+1
    up_mat = gate_mat + 1
    gate = _hadamard(_parts_sum(parts_ptr, 2 * pair, rows, offs, WIDTH, PARTS))
    gate = gate * tl.load(svh_ptr + gate_mat * WIDTH + offs).to(tl.float32)
    up = _hadamard(_parts_sum(parts_ptr, 2 * pair + 1, rows, offs, WIDTH, PARTS))
    up = up * tl.load(svh_ptr + up_mat * WIDTH + offs).to(tl.float32)
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    h = gate / (1.0 + tl.exp(-gate)) * up
    h = _hadamard(h * tl.load(suh_ptr + expert * WIDTH + offs).to(tl.float32))
    dest = pair.to(tl.int64) * WIDTH + _kernel_order(block, ORDER)
    _store_halves(out_ptr, dest, tl.num_programs(0).to(tl.int64) * WIDTH, h, None, SPLIT)


@triton.jit
def _weighted_sum(
    parts_ptr,
    out_ptr,
    expert_ptr,
    svh_ptr,
    weight_ptr,
    add_ptr,
    WIDTH: tl.constexpr,
    PARTS: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    ADD: tl.constexpr = False,
):
    """After the down GEMV, one 128-block of row r: Σ_j weight[r, j] · H(Σ partials of pair rK + j) · svh[expert]
    over its K pairs (KP = K rounded up to a power of two), all K at once, then summed in the fixed order of one
    reduction: nothing from other rows enters, so a row's bits do not depend on the batch. ADD: plus the row's
    `add` (the shared expert's output), one fp32 addition after the sum, as a separate add would make it."""
    row = tl.program_id(0)
    block = tl.program_id(1)
    pairs = tl.num_programs(0) * K
    offs = block * 128 + tl.arange(0, 128)
    j = tl.arange(0, KP)[:, None]
    live = j < K
    pair = row * K + j  # [KP, 1]
    expert = tl.load(expert_ptr + pair, mask=live, other=0).to(tl.int64)
    y = tl.zeros([KP, 128], dtype=tl.float32)
    for part in tl.static_range(PARTS):
        y += tl.load(parts_ptr + (part * pairs + pair).to(tl.int64) * WIDTH + offs[None, :], mask=live, other=0.0)
    y = _hadamard_rows(y, KP)
    y = y * tl.load(svh_ptr + expert * WIDTH + offs[None, :], mask=live, other=0.0).to(tl.float32)
    y = y * tl.load(weight_ptr + pair, mask=live, other=0.0)
    total = tl.sum(y, axis=0)
    if ADD:
        total += tl.load(add_ptr + row.to(tl.int64) * WIDTH + offs)
    tl.store(out_ptr + row.to(tl.int64) * WIDTH + offs, total)


@triton.jit
def _exl3_unpack(
    t_ptr,
    out_ptr,
    N_TILES: tl.constexpr,
    WORDS: tl.constexpr,
    BITS2: tl.constexpr,
    CODEBOOK: tl.constexpr,
    BNT: tl.constexpr,
    MUL1_SCALE: tl.constexpr,
    MUL1_BIAS: tl.constexpr,
    ASM: tl.constexpr,
):
    """W_q fp16 [K, N] from trellis words: one program per (k tile, BNT n tiles)."""
    kt = tl.program_id(0)
    block = tl.program_id(1)
    quad = tl.arange(0, 8)[:, None]
    lane4 = tl.arange(0, 4)[None, :]
    lane_words = (4 * quad + lane4)[None, :, :]
    tiles = block * BNT + tl.arange(0, BNT)
    base = t_ptr + (kt * N_TILES + tiles).to(tl.int64)[:, None, None] * WORDS
    cur, prev = _tile_words(base, lane_words, BITS2 == 8)
    for j in tl.static_range(8):
        w = _tile_values(
            base, quad, lane4, j, WORDS, BITS2, BITS2 == 8, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM
        ).to(tl.float16)
        row = 2 * lane4 + (j & 1) + 8 * ((j >> 1) & 1)  # [1, 4]
        col = quad + 8 * (j >> 2)  # [8, 1]
        ptr = (
            out_ptr
            + (kt * 16 + row).to(tl.int64)[None, :, :] * (N_TILES * 16)
            + (tiles * 16)[:, None, None]
            + col[None, :, :]
        )
        tl.store(ptr, w)


@triton.jit
def _tile_fragment(
    base,
    quad,
    lane4,
    cur,
    prev,
    WORDS: tl.constexpr,
    BITS2: tl.constexpr,
    CODEBOOK: tl.constexpr,
    MUL1_SCALE: tl.constexpr,
    MUL1_BIAS: tl.constexpr,
    ASM: tl.constexpr,
    BNT: tl.constexpr,
    F16: tl.constexpr = False,
    W_T: tl.constexpr = False,
):
    """BNT tiles at `base` ([1, BNT, 1] word pointers; quad [1, 1, 8], lane4 [4, 1, 1]) as one [16, 16 BNT] fp32
    (F16: fp16) tensor-core operand: rows are the tile's inputs in the grouped MMA's order (position 4 (l%4) +
    2 (j>>1 & 1) + (j&1), which `rotate_rows(order="mma")` gives the activations), columns the outputs in their
    natural order (tile, then c = l//4 + 8 (j>>2)). Value (l, j) is decoded as in the GEMV. A thread's values of one lane and one column
    half are 4 consecutive inputs, so the operand is built as [outputs, inputs] with them innermost and transposed:
    16-byte stores to the MMA's K-major shared layout (the GEMV's input order here stored through stmatrix with 19-way
    bank conflicts, ncu; this order is 1.3x faster, though its stores are still ~21-way conflicted: docs/BENCHMARKS.md).
    cur / prev: the 4-bit path's words (`_tile_words`), loaded by the caller ahead. W_T: the operand transposed,
    [16 BNT outputs, 16 inputs] with the inputs in their natural order, no transposition: `_exl3_grouped_wgmma`'s
    register operand, whose layout is then the one the values were decoded in."""
    D4: tl.constexpr = BITS2 == 8
    w0 = _tile_values(base, quad, lane4, 0, WORDS, BITS2, D4, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)
    w1 = _tile_values(base, quad, lane4, 1, WORDS, BITS2, D4, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)
    w2 = _tile_values(base, quad, lane4, 2, WORDS, BITS2, D4, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)
    w3 = _tile_values(base, quad, lane4, 3, WORDS, BITS2, D4, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)
    w4 = _tile_values(base, quad, lane4, 4, WORDS, BITS2, D4, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)
    w5 = _tile_values(base, quad, lane4, 5, WORDS, BITS2, D4, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)
    w6 = _tile_values(base, quad, lane4, 6, WORDS, BITS2, D4, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)
    w7 = _tile_values(base, quad, lane4, 7, WORDS, BITS2, D4, cur, prev, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, F16)
    low = tl.join(tl.join(w0, w1), tl.join(w2, w3))  # [4 (l%4), BNT, 8 (l//4), 2 (j&1), 2 (j>>1 & 1)]
    high = tl.join(tl.join(w4, w5), tl.join(w6, w7))
    every = tl.join(low, high)  # [.., 2 (j>>2)]
    if W_T:  # [outputs, inputs]: outputs (tile, j>>2, l//4), inputs in their natural order (j>>1 & 1, l%4, j&1)
        w = tl.reshape(tl.permute(every, (1, 5, 2, 4, 0, 3)), [16 * BNT, 16])
    else:  # [inputs, outputs]: inputs (l%4, j>>1 & 1, j&1), outputs (tile, j>>2, l//4)
        w = tl.trans(tl.reshape(tl.permute(every, (1, 5, 2, 0, 4, 3)), [16 * BNT, 16]))
    return w


@triton.jit
def _grouped_program(N_FIRST: tl.constexpr):
    """(pair block b, output block n, matrix m) of a grouped-product program: the grid is (b, n, m), or (n, b, m)
    with N_FIRST (`_grouped_grid`)."""
    if N_FIRST:
        n = tl.program_id(0)
        b = tl.program_id(1)
    else:
        b = tl.program_id(0)
        n = tl.program_id(1)
    return b, n, tl.program_id(2)


@triton.jit
def _exl3_grouped(
    x_ptr,
    t_ptr,
    block_ptr,
    dest_ptr,
    out_ptr,
    K_TILES: tl.constexpr,
    N_TILES: tl.constexpr,
    WORDS: tl.constexpr,
    BITS2: tl.constexpr,
    CODEBOOK: tl.constexpr,
    BM: tl.constexpr,
    BNT: tl.constexpr,
    MATS: tl.constexpr,
    SCATTER: tl.constexpr,
    SPLIT_X: tl.constexpr,
    KU: tl.constexpr,
    PREFETCH: tl.constexpr,
    MUL1_SCALE: tl.constexpr,
    MUL1_BIAS: tl.constexpr,
    ASM: tl.constexpr,
    F16: tl.constexpr = False,
    N_FIRST: tl.constexpr = False,
    xl_ptr=None,
    X16: tl.constexpr = False,
):
    """A prompt chunk's (row, expert) pairs, sorted by expert, times their experts' W_q on the tensor cores: program
    (b, n, m) takes block b of the block table ((expert, first pair, end pair): at most BM pairs of one expert),
    output columns n·16·BNT.., and matrix MATS·expert + m (gate / up: MATS = 2, x row 2p + m; down: MATS = 1, x row
    p). Each K tile's trellis words are decoded once for the block's BM rows straight into the MMA operand
    (`_tile_fragment`; W_q never reaches memory); x rows in the grouped MMA's input order, fp32 (X16: as two fp16
    operands). Without F16 the MMA
    is TF32: W_q's fp16 values are exact in it, and with SPLIT_X each x is the sum of its TF32 part and the
    remainder, two products, so the result is as close as fp32 (without: one product, x rounded to TF32's 11 bits).
    F16 (the default launch): the same with fp16 operands (W_q's values are fp16; x as its fp16 rounding and the
    fp16 of the remainder): half the shared-memory bytes for the decoded operand and twice the MMA rate. fp16's
    range bounds it both ways: an |x| past 65,504 would overflow (the activations here - normed inputs, SwiGLU
    outputs clamped at the limit, ≤ limit² before the rotation, ≤ √128 times that after - stay orders of magnitude
    below), and below 2^-14 the remainder loses bits to subnormals, so each x carries an absolute error up to 2^-25
    where TF32's is relative (at the served shapes the sums came closer to fp32 than TF32's: 2.5e-5 against 4.9e-5).
    Output row: MATS·p + m, or dest[p] (SCATTER). A block with no pairs does nothing, so the launch shape depends on
    the pair count alone. N_FIRST: the grid's first two axes swapped, (n, b, m), so the programs that read one
    block's x rows run side by side and find them in L2. X16 (with F16): x comes as its two fp16 operands, made once
    by the kernel before (`_store_halves`: the same values this kernel's split gives), x_ptr the first, xl_ptr the
    remainder: no split at every K step of every program."""
    tl.static_assert(X16 == F16, "fp16 operands come as x's two halves, made once (`_store_halves`)")
    b, n, m = _grouped_program(N_FIRST)
    expert = tl.load(block_ptr + 3 * b).to(tl.int64)
    first = tl.load(block_ptr + 3 * b + 1)
    end = tl.load(block_ptr + 3 * b + 2)
    pair = first + tl.arange(0, BM)
    live = pair < end
    x_row = (pair * MATS + m).to(tl.int64)
    x_offs = x_row[:, None] * (K_TILES * 16) + tl.arange(0, 16)[None, :]
    x_ptrs = x_ptr + x_offs
    lane4 = tl.arange(0, 4)[:, None, None]
    quad = tl.arange(0, 8)[None, None, :]
    tiles = (n * BNT + tl.arange(0, BNT))[None, :, None]
    t_base = t_ptr + (expert * MATS + m) * (K_TILES * N_TILES * WORDS) + tiles * WORDS
    acc = tl.zeros([BM, 16 * BNT], dtype=tl.float32)
    lane_words = 4 * quad + lane4
    step_words = N_TILES * WORDS
    if end > first:  # an empty block does nothing
        # the next K tile's 4-bit words are loaded while this one is decoded and multiplied (PREFETCH): each step's
        # decode waits on its loads otherwise, one memory latency a step
        cur, prev = _tile_words(t_base, lane_words, BITS2 == 8)
        for kt0 in range(0, K_TILES, KU):
            for u in tl.static_range(KU):
                kt = kt0 + u
                base = t_base + kt * step_words
                if PREFETCH:
                    ahead = t_base + tl.minimum(kt + 1, K_TILES - 1) * step_words
                    next_cur, next_prev = _tile_words(ahead, lane_words, BITS2 == 8)
                else:
                    cur, prev = _tile_words(base, lane_words, BITS2 == 8)
                    next_cur, next_prev = cur, prev
                w = _tile_fragment(
                    base, quad, lane4, cur, prev, WORDS, BITS2, CODEBOOK, MUL1_SCALE, MUL1_BIAS, ASM, BNT, F16
                )
                x = tl.load(x_ptrs + kt * 16, mask=live[:, None], other=0.0)
                if X16:  # x_ptr / xl_ptr: x's two fp16 operands, made once (`_store_halves`)
                    acc = tl.dot(x, w, acc)
                    if SPLIT_X:
                        rest = tl.load(xl_ptr + x_offs + kt * 16, mask=live[:, None], other=0.0)
                        acc = tl.dot(rest, w, acc)
                elif SPLIT_X:
                    head = (x.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
                    acc = tl.dot(head, w, acc, input_precision="tf32")
                    acc = tl.dot(x - head, w, acc, input_precision="tf32")
                else:
                    acc = tl.dot(x, w, acc, input_precision="tf32")
                cur, prev = next_cur, next_prev
    if SCATTER:
        out_row = tl.load(dest_ptr + pair, mask=live, other=0).to(tl.int64)
    else:
        out_row = x_row
    cols = n * (16 * BNT) + tl.arange(0, 16 * BNT)
    tl.store(out_ptr + out_row[:, None] * (N_TILES * 16) + cols[None, :], acc, mask=live[:, None])


@gluon.jit
def _ring(SLOTS: gl.constexpr, BM: gl.constexpr, layout: gl.constexpr):
    """SLOTS shared buffers [BM, 16] fp16, each its own allocation: Triton's barrier pass then sees a copy into one
    slot and an MMA reading another as apart (slices of one allocation put a barrier beside every copy)."""
    slots = ()
    for _ in gl.static_range(SLOTS):
        slots = slots + (gl.allocate_shared_memory(gl.float16, [BM, 16], layout),)  # type: ignore[assignment]
    return slots


@gluon.jit
def _x_stage(
    heads,
    rests,
    xh_ptrs,
    xl_ptrs,
    live,
    buf: gl.constexpr,
    kt,
    K_TILES: gl.constexpr,
    KB: gl.constexpr,
    SPLIT_X: gl.constexpr,
):
    """K tiles kt .. kt + KB - 1 of a block's x operands (pointers [BM, 16] at tile 0, live [BM, 1]) copied from
    memory into shared buffers buf·KB + u without passing through registers (cp.async, 16 bytes a thread a copy;
    tiles past K_TILES are not read), as one commit group."""
    for u in gl.static_range(KB):
        ok = live & (kt + u < K_TILES)
        async_copy.async_copy_global_to_shared(heads[buf * KB + u], xh_ptrs + (kt + u) * 16, mask=ok)
        if SPLIT_X:
            async_copy.async_copy_global_to_shared(rests[buf * KB + u], xl_ptrs + (kt + u) * 16, mask=ok)
    async_copy.commit_group()


@gluon.jit
def _exl3_grouped_wgmma(
    xh_ptr,
    xl_ptr,
    t_ptr,
    block_ptr,
    dest_ptr,
    out_ptr,
    K_TILES: gl.constexpr,
    N_TILES: gl.constexpr,
    WORDS: gl.constexpr,
    BITS2: gl.constexpr,
    CODEBOOK: gl.constexpr,
    BM: gl.constexpr,
    BNT: gl.constexpr,
    MATS: gl.constexpr,
    SCATTER: gl.constexpr,
    SPLIT_X: gl.constexpr,
    MUL1_SCALE: gl.constexpr,
    MUL1_BIAS: gl.constexpr,
    ASM: gl.constexpr,
    WARPS: gl.constexpr,
    N_FIRST: gl.constexpr,
    KB: gl.constexpr,
    STAGES: gl.constexpr,
):
    """`_exl3_grouped` with fp16 operands on Hopper's warpgroup MMA (Gluon: layouts stated, not inferred), the
    product transposed: accᵀ [16 BNT outputs, BM pairs] += W_qᵀ · xᵀ. The format lays a tile's values out as the
    MMA's A fragment (lane l holds outputs l//4, l//4 + 8 and inputs 2 (l%4) + (0, 1, 8, 9)), so with the words
    loaded in a layout whose lanes are the tile's lanes and whose warps are its tiles, the decoded W_qᵀ is the
    register operand as it stands (the conversion is checked trivial at compile time): nothing of W_q goes through
    shared memory, where `_exl3_grouped`'s operand stores were 21-way bank-conflicted. x comes as its two fp16
    operands (x rounded, and the remainder: `_store_halves`, made once by the kernel before, natural input order)
    and goes into a ring of STAGES stages of KB K tiles in shared memory by cp.async (not through registers): the B
    operand. The MMAs are asynchronous: a tile's decode runs while the tile before's products are on the tensor
    cores, and the program waits for those only then (their register operand stays live until that wait). The ring
    moves on at a stage's first tile, behind a barrier: 0.5 a tile at 4 tiles a stage, where the form before took 2
    (each slot of the ring its own allocation, `_ring`). The products and their order are those of the synchronous
    form, so the sums are the same bits. Same block table, outputs and program grid as `_exl3_grouped` (N_FIRST: its first
    two axes swapped)."""
    gl.static_assert(STAGES >= 2, "a stage in use and one in flight at least")
    gl.static_assert(K_TILES % (STAGES * KB) == 0, "the ring's turns divide the K tiles")
    b, n, m = _grouped_program(N_FIRST)
    # words [4 (l%4), BNT tiles, 8 (l//4)]: lane l = 4 (l//4) + l%4 of the warp, tile t on warp t % WARPS
    words: gl.constexpr = gl.BlockedLayout([1, 1, 1], [4, 1, 8], [1, WARPS, 1], [0, 2, 1])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BM, 16])
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    copies: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [WARPS, 1], [1, 0])  # 16 bytes a thread a copy
    shared: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)
    expert = gl.load(block_ptr + 3 * b).to(gl.int64)
    first = gl.load(block_ptr + 3 * b + 1)
    end = gl.load(block_ptr + 3 * b + 2)
    pair = first + gl.arange(0, BM, layout=gl.SliceLayout(1, copies))
    live = gl.expand_dims(pair < end, 1)
    x_at = gl.expand_dims((pair * MATS + m).to(gl.int64), 1) * (K_TILES * 16) + gl.expand_dims(
        gl.arange(0, 16, layout=gl.SliceLayout(0, copies)), 0
    )
    xh_ptrs = xh_ptr + x_at
    xl_ptrs = xl_ptr + x_at
    lane4 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, words))), 1), 2)
    tiles = n * BNT + gl.arange(0, BNT, layout=gl.SliceLayout(0, gl.SliceLayout(2, words)))
    tiles = gl.expand_dims(gl.expand_dims(tiles, 0), 2)
    quad = gl.expand_dims(gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, words))), 0), 1)
    t_base = t_ptr + (expert * MATS + m) * (K_TILES * N_TILES * WORDS) + tiles * WORDS
    lane_words = 4 * quad + lane4
    step_words = N_TILES * WORDS
    heads = _ring(STAGES * KB, BM, shared)
    rests = _ring(STAGES * KB if SPLIT_X else 0, BM, shared)
    acc = gl.zeros([16 * BNT, BM], gl.float32, layout=mma)
    if end > first:
        for s in gl.static_range(STAGES - 1):
            _x_stage(heads, rests, xh_ptrs, xl_ptrs, live, s, s * KB, K_TILES, KB, SPLIT_X)
        cur, prev = _tile_words(t_base, lane_words, BITS2 == 8)
        w_prev = gl.zeros([16 * BNT, 16], gl.float16, layout=operand)
        for k0 in range(0, K_TILES, STAGES * KB):  # the ring unrolled: every buffer a constant
            for stage in gl.static_range(STAGES):
                for t in gl.static_range(KB):
                    kt = k0 + stage * KB + t
                    ahead = gl.minimum(kt + 1, K_TILES - 1)
                    next_cur, next_prev = _tile_words(t_base + ahead * step_words, lane_words, BITS2 == 8)
                    w = _tile_fragment(
                        t_base + kt * step_words,
                        quad,
                        lane4,
                        cur,
                        prev,
                        WORDS,
                        BITS2,
                        CODEBOOK,
                        MUL1_SCALE,
                        MUL1_BIAS,
                        ASM,
                        BNT,
                        True,
                        True,
                    )
                    w = gl.convert_layout(w, operand, assert_trivial=True)
                    if t == 0:
                        # the last stage's products done; this stage's copies landed (the next STAGES - 2 may
                        # still be in flight), seen by every thread and by the MMAs' proxy; past the barrier no
                        # warpgroup reads the last stage's buffers, so the stage STAGES - 1 ahead goes into them
                        acc, w_prev = hopper.warpgroup_mma_wait(num_outstanding=0, deps=(acc, w_prev))
                        async_copy.wait_group(STAGES - 2)
                        hopper.fence_async_shared()
                        gl.thread_barrier()
                        _x_stage(
                            heads, rests, xh_ptrs, xl_ptrs, live, (stage + STAGES - 1) % STAGES,
                            kt + (STAGES - 1) * KB, K_TILES, KB, SPLIT_X,
                        )  # fmt: skip
                    acc = hopper.warpgroup_mma(w, heads[stage * KB + t].permute((1, 0)), acc, is_async=True)
                    if SPLIT_X:
                        acc = hopper.warpgroup_mma(w, rests[stage * KB + t].permute((1, 0)), acc, is_async=True)
                    # the tile before's products done, this tile's left in flight while the next is decoded: its
                    # register operand stays live until the next wait
                    acc, w_prev = hopper.warpgroup_mma_wait(num_outstanding=2 if SPLIT_X else 1, deps=(acc, w_prev))
                    w_prev = w
                    cur, prev = next_cur, next_prev
        acc, w_prev = hopper.warpgroup_mma_wait(num_outstanding=0, deps=(acc, w_prev))
        async_copy.wait_group(0)  # the copies past the last tile (masked: nothing read)
    # stores along the outputs: a thread's 4 consecutive outputs of one pair
    outs: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, WARPS], [0, 1])
    acc = gl.convert_layout(acc, outs)
    pair = first + gl.arange(0, BM, layout=gl.SliceLayout(0, outs))
    live = pair < end
    if SCATTER:
        out_row = gl.load(dest_ptr + pair, mask=live, other=0).to(gl.int64)
    else:
        out_row = (pair * MATS + m).to(gl.int64)
    cols = n * (16 * BNT) + gl.arange(0, 16 * BNT, layout=gl.SliceLayout(1, outs))
    out_ptrs = out_ptr + gl.expand_dims(out_row, 0) * (N_TILES * 16) + gl.expand_dims(cols, 1)
    gl.store(out_ptrs, acc, mask=gl.expand_dims(live, 0))


# -- host side ---------------------------------------------------------------------------------------------------


def _words(trellis: torch.Tensor) -> torch.Tensor:
    """int16 [..., 16*bits] -> int32 [..., 8*bits]: little-endian pairs, the format's 32-bit words."""
    return trellis.contiguous().view(torch.int32)


def _format(trellis: torch.Tensor, codebook: str) -> tuple[int, int]:
    bits = exl3.width_of(trellis.shape[-1])
    if not bits:
        raise exl3.Exl3FormatError(
            f"trellis last dimension {trellis.shape[-1]} is not 16*bits for a width in {exl3.WIDTHS}"
        )
    if not float(bits).is_integer() and codebook != "mul1":
        raise exl3.Exl3FormatError(f"{bits}-bit tiles need the mul1 codebook, got {codebook}")
    return int(2 * bits), CODEBOOK_ID[codebook]


def _asm(asm: bool | None) -> bool:
    """The inline-PTX decode (`_decode`): on unless asked off or LAUNCH_DEFAULTS["asm"] is False; never in the
    interpreter."""
    return not _INTERPRETED and (LAUNCH_DEFAULTS.get("asm", True) if asm is None else asm)


def exl3_unpack(trellis: torch.Tensor, codebook: str, asm: bool | None = None) -> torch.Tensor:
    """W_q fp16 [K, N] from trellis int16 [K/16, N/16, 16*bits]: exl3.unpack's values, bit for bit."""
    bits2, cb = _format(trellis, codebook)
    k_tiles, n_tiles, _ = trellis.shape
    out = torch.empty(k_tiles * 16, n_tiles * 16, dtype=torch.float16, device=trellis.device)
    bnt = math.gcd(8, n_tiles)
    _exl3_unpack[(k_tiles, n_tiles // bnt)](
        _words(trellis),
        out,
        N_TILES=n_tiles,
        WORDS=bits2 * 4,
        BITS2=bits2,
        CODEBOOK=cb,
        BNT=bnt,
        MUL1_SCALE=_MUL1_SCALE,
        MUL1_BIAS=_MUL1_BIAS,
        ASM=_asm(asm),
    )
    return out


def kernel_order(x: torch.Tensor) -> torch.Tensor:
    """[..., K] -> [..., K] with each 16-input tile in the kernel's (j&3, l%4) order."""
    order = torch.tensor(_INPUT_ORDER, device=x.device)
    return x.reshape(*x.shape[:-1], -1, 16)[..., order].reshape(x.shape)


def _config(
    k_tiles: int,
    n_tiles: int,
    block_n_tiles: int | None,
    split: int | None,
    unroll: int,
    rows: int = 1,
    wide: bool = True,
) -> tuple[int, int, int]:
    """(BNT, SPLIT, KU): BNT output tiles a program (16 for 1-2 rows: fewer input loads and loop instructions a
    weight, bench/exl3_sass.py; 8 for more, where 16 would need ~128 registers; 8 also where `wide` is false: the
    mul1 codebook at widths other than 4, whose one-row kernel with 16 tiles a program gives wrong sums under
    Triton 3.6 on the H200 (40-70 % off, bench/exl3_mul1_probe.py; no rewriting of the decode avoided it, 8 tiles or
    2 rows did: a compiler fault, not the format's)); K split into runs of SPLIT_TILES
    tiles. The split depends on the matrix alone, never on the number of groups: it sets the order of the sums, and
    a row's bits must not depend on the batch. In Triton's interpreter (CPU tests) K is not split unless asked: each
    program costs milliseconds there."""
    bnt = math.gcd(block_n_tiles or (16 if rows <= 2 and wide else 8), n_tiles)
    if split is None:
        split = 1
        while not _INTERPRETED and k_tiles // (2 * split) >= SPLIT_TILES and k_tiles % (2 * split * unroll) == 0:
            split *= 2
    if k_tiles % split or (k_tiles // split) % unroll:
        raise ValueError(f"K/16 = {k_tiles} tiles do not split {split} ways in steps of {unroll}")
    return bnt, split, unroll


def rotate_rows(
    x: torch.Tensor,
    rows: int,
    mats: torch.Tensor,
    *,
    pre: torch.Tensor | None = None,
    post: torch.Tensor | None = None,
    add: torch.Tensor | None = None,
    live_rows: int | None = None,
    order: str = "natural",
    share: int = 1,
    paired: bool = False,
    gather: torch.Tensor | None = None,
    num_warps: int = 4,
    block_rows: int = 1,
    split: bool = False,
) -> torch.Tensor:
    """x [PARTS, G*rows / share, W] fp32 (partials summed in order) -> H(Σ x · pre[mats]) · post[mats] + add[mats],
    [G*rows, W] fp32 (output row r from input row r // share); pre / post / add are [E, W]. `paired`: mats holds
    G/2 ids and group g uses matrix 2 ids[g // 2] + g % 2 (an expert's gate and up). `gather` [G*rows / share]:
    output row r reads input row gather[r // share] of x [1, any, W] instead. `order` (INPUT_ORDERS): how each
    16-input tile is stored — as is, in `_exl3_gemv`'s input order or in `_exl3_grouped`'s. `block_rows`: rows a
    program (a power of two; a row's bits are the same at any). `split`: fp16 [2, G*rows, W] instead, each value as
    `_exl3_grouped_wgmma`'s two operands (`_store_halves`)."""
    parts, total, width = x.shape
    if block_rows < 1 or block_rows & (block_rows - 1):
        raise ValueError(f"block_rows={block_rows}: rows a program is a power of two")
    if gather is not None:
        if parts != 1:
            raise ValueError("a gathered rotation reads one part")
        total = gather.numel()
    total *= share
    out = _operands((total, width), split, x.device)
    dummy = out
    _rotate[(-(-total // block_rows), width // exl3.HADAMARD_BLOCK)](
        x.contiguous(),
        out,
        mats,
        dummy if pre is None else pre,
        dummy if post is None else post,
        dummy if add is None else add,
        rows if live_rows is None else live_rows,
        share,
        dummy if gather is None else gather,
        total,
        WIDTH=width,
        ROWS=rows,
        PARTS=parts,
        PRE=pre is not None,
        POST=post is not None,
        ADD=add is not None,
        ORDER=INPUT_ORDERS[order],
        PAIRED=paired,
        GATHER=gather is not None,
        R=block_rows,
        SPLIT=split,
        num_warps=num_warps,
    )
    return out


def _operands(shape: tuple[int, int], split: bool, device: torch.device) -> torch.Tensor:
    """Where a grouped product's x goes: fp32 [R, W], or (split) its two fp16 operands [2, R, W]."""
    if split:
        return torch.empty((2, *shape), dtype=torch.float16, device=device)
    return torch.empty(shape, dtype=torch.float32, device=device)


def gemv_form(device: torch.device, form: str | None = None) -> str:
    """The decode GEMV's form on `device`: `form` (or LAUNCH_DEFAULTS["form"], else "fma") where it applies — "mma"
    needs compiled CUDA (Gluon kernels do not run in the interpreter) with `mma.sync` (compute capability 8.0 on:
    the H200's 9.0, the GB10's 12.1) — else "fma"."""
    form = form or LAUNCH_DEFAULTS.get("form", "fma")
    if form not in GEMV_FORMS:
        raise ValueError(f"form={form!r}: the decode GEMV's forms are {GEMV_FORMS}")
    if form == "mma" and not (
        device.type == "cuda"
        and not _INTERPRETED
        and torch.version.hip is None
        and torch.cuda.get_device_capability(device) >= (8, 0)
    ):
        return "fma"
    return form


def gemv_order(device: torch.device, form: str | None = None) -> str:
    """The input order (INPUT_ORDERS) the decode GEMV of that form reads its rows in."""
    return "natural" if gemv_form(device, form) == "mma" else "gemv"


def exl3_gemv_parts(
    xp: torch.Tensor,
    trellis: torch.Tensor,
    mats: torch.Tensor,
    codebook: str,
    block_n_tiles: int | None = None,
    split: int | None = None,
    unroll: int | None = None,
    num_warps: int | None = None,
    asm: bool | None = None,
    paired: bool = False,
    form: str | None = None,
) -> torch.Tensor:
    """The kernel alone: xp fp32 [G, ROWS, K] (rotated, in `gemv_order`'s order for the form, ROWS in 1, 2, 4, 8),
    trellis int16 [E, K/16, N/16, 16*bits], mats int32 / int64 [G] (`paired`: [G/2], group g uses matrix
    2 mats[g // 2] + g % 2) -> fp32 partials [SPLIT, G, ROWS, N] (their sum is xp @ W_q).
    Launch options not given come from LAUNCH_DEFAULTS, then GEMV_LAUNCH (bench/exl3_gemv_bench.py times them)."""
    form = gemv_form(xp.device, form)
    launch = GEMV_LAUNCH[form]
    block_n_tiles = block_n_tiles or LAUNCH_DEFAULTS.get("block_n_tiles") or launch.get("block_n_tiles")
    split = split or LAUNCH_DEFAULTS.get("split")
    unroll = unroll or LAUNCH_DEFAULTS.get("unroll") or launch["unroll"]
    num_warps = num_warps or LAUNCH_DEFAULTS.get("num_warps") or launch["num_warps"]
    asm = _asm(asm)
    bits2, cb = _format(trellis, codebook)
    _, k_tiles, n_tiles, _ = trellis.shape
    groups, rows, k = xp.shape
    if k != 16 * k_tiles or rows not in (1, 2, 4, 8):
        raise ValueError(f"rows [G, ROWS, K] with ROWS in 1, 2, 4, 8 and K = {16 * k_tiles}, got {list(xp.shape)}")
    wide = form == "mma" or not (cb == CODEBOOK_ID["mul1"] and bits2 != 8)  # see _config
    bnt, split, unroll = _config(k_tiles, n_tiles, block_n_tiles, split, unroll, rows, wide)
    out = torch.empty(split, groups, rows, 16 * n_tiles, dtype=torch.float32, device=xp.device)
    shape = dict(K_TILES=k_tiles, N_TILES=n_tiles, WORDS=bits2 * 4, BITS2=bits2, CODEBOOK=cb, ROWS=rows, BNT=bnt)
    decode = dict(SPLIT=split, KU=unroll, MUL1_SCALE=_MUL1_SCALE, MUL1_BIAS=_MUL1_BIAS, ASM=asm, PAIRED=paired)
    if form == "mma":
        if bnt % num_warps or unroll not in (1, 2, 4):
            raise ValueError(
                f"the mma form takes a whole number of output tiles a warp and 1, 2 or 4 K tiles a step: "
                f"{bnt} tiles, {num_warps} warps, unroll {unroll}"
            )
        LAST_LAUNCH["gemv"] = _exl3_gemv_mma[(groups, n_tiles // bnt, split)](
            xp, _words(trellis), mats, out, **shape, **decode, WARPS=num_warps, num_warps=num_warps
        )
        return out
    LAST_LAUNCH["gemv"] = _exl3_gemv[(groups, n_tiles // bnt, split)](
        xp, _words(trellis), mats, out, **shape, **decode, num_warps=num_warps
    )
    return out


def exl3_matmul(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    mats: torch.Tensor,
    codebook: str,
    bias: torch.Tensor | None = None,
    **kw,
) -> torch.Tensor:
    """y[g] = x[g] @ W[mats[g]] (+ bias[mats[g]]) in fp32: x [G, M, K] (M <= 8); trellis [E, K/16, N/16, 16*bits];
    suh [E, K]; svh [E, N]; bias [E, N] or None; mats [G] (on the device: no host sync). Three launches: rotate the
    input (suh, H, kernel order), the decode GEMV, rotate the output (split partials summed in order, H, svh, bias).
    The conventions of exl3.Exl3Linear.forward; a row's result does not depend on the other rows."""
    if trellis.dim() == 3:
        trellis, suh, svh = trellis.unsqueeze(0), suh.reshape(1, -1), svh.reshape(1, -1)
        bias = None if bias is None else bias.reshape(1, -1)
    groups, m, k = x.shape
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"1..{MAX_ROWS} rows a matrix, got {m}")
    rows = 1 << (m - 1).bit_length()  # 1, 2, 4, 8: zero rows pad the rest
    mats = mats.to(torch.int32).contiguous()
    xin = x.float()
    if rows != m:
        xin = torch.cat([xin, xin.new_zeros(groups, rows - m, k)], dim=1)
    order = gemv_order(x.device, kw.get("form"))
    xp = rotate_rows(xin.reshape(1, groups * rows, k), rows, mats, pre=suh.contiguous(), live_rows=m, order=order)
    parts = exl3_gemv_parts(xp.view(groups, rows, k), trellis, mats, codebook, **kw)
    y = rotate_rows(
        parts.view(parts.shape[0], groups * rows, -1),
        rows,
        mats,
        post=svh.contiguous(),
        add=None if bias is None else bias.contiguous(),
    )
    return y.view(groups, rows, -1)[:, :m]


def exl3_linear(linear: exl3.Exl3Linear, x: torch.Tensor, **kw) -> torch.Tensor:
    """One Exl3Linear (tensors on x's device) applied to x [..., K] fp32: decode rows in the kernel, up to 8 rows a
    launch; more rows (a prompt chunk) through the exact fp16 W_q decoded once (transient, 2 bytes a weight)."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k).float()
    if rows.shape[0] > MAX_ROWS:
        wq = exl3_unpack(linear.trellis, linear.codebook).float()
        y = exl3.rotate(exl3.rotate(rows * linear.suh.float(), -1) @ wq, -1) * linear.svh.float()
        y = y if linear.bias is None else y + linear.bias.float()
    else:
        mats = torch.zeros(1, dtype=torch.int32, device=x.device)
        y = exl3_matmul(rows[None], linear.trellis, linear.suh, linear.svh, mats, linear.codebook, linear.bias, **kw)[0]
    return y.reshape(*lead, -1)


PAIRS_MAX = 576  # (row, expert) pairs up to which the routed experts run as sync-free GEMVs: 64 rows (8 lanes ×
# a verify window of 8) at top-8 plus one; a prompt chunk beyond decodes each selected expert once


# `grouped_experts`' launch (bench/exl3_prompt_bench.py times alternatives)
PROMPT_LAUNCH: dict = {
    # both forms
    "bm": None,  # pairs a program: 128 where the experts average 128 pairs or more, else 64 (`_block_rows`)
    "bnt": 8,  # output tiles a program
    "split_x": True,  # x as two operands (head and remainder): fp32-close sums
    "n_first": True,  # the grid as (output block, pair block, matrix): one block's programs side by side
    # fp16 operands (`_exl3_grouped`'s F16) and one-warp rotations: H200, TP=2's shard, 2,048 / 8,192 tokens, 7.22 /
    # 18.46 ms against 8.38 / 22.52 with TF32 and four warps (fp16 alone 7.72 / 21.00, one warp alone 7.76 / 20.24;
    # bench/results/2026-12-03-h200-session20-call3-benches.json)
    "operands": "fp16",  # "tf32" takes the dot form
    "rotate_warps": 1,  # warps a 128-block program of the rotations around the products (their bits at any count;
    # `_weighted_sum`'s sum of a row's k pairs follows the layout, so its last bits do not)
    "rotate_rows": 4,  # rows a program of the rotation before gate‖up (the same bits at any count): H200, 2,048
    # tokens (0.54 GB written), 0.647 ms at one row, 0.207 at four, 0.23 at 8 or 16 with more warps
    # (bench/results/2026-12-03-h200-session22-call3-benches.json)
    # "wgmma": `_exl3_grouped_wgmma` where it applies (compute capability 9.0 on CUDA, fp16 operands, any width);
    # "dot": `_exl3_grouped` everywhere (the form the other GPUs and the interpreter run)
    "form": "wgmma",
    "wgmma_warps": None,  # wgmma form: warps a program, a multiple of 4; None: 4 for 64-pair blocks, 8 for 128
    "stage_tiles": 4,  # wgmma form: K tiles of x a stage of its ring of shared buffers (the ring moves on a stage)
    "wgmma_maxnreg": 128,  # wgmma form: registers a thread at most (ptxas' cap): 4 programs of 4 warps an SM (the
    # uncapped build takes 138 at 64 pairs, 3 programs; capped: a 24-byte stack, 5 spill loads a ring's turn outside
    # the tiles' work: bench/exl3_sass.py --grouped)
    "stages": 2,  # wgmma form: the ring's stages (one in use, the next STAGES - 1 copies in flight); the ring's
    # tiles must divide the K tiles (it is unrolled): 8, a Hadamard block's, divides every shard's width
    # dot form only
    "ku": 1,  # K tiles a step
    "prefetch": True,  # the next K tile's words loaded ahead
    "num_warps": 4,
}


def _block_rows(pairs: int, experts: int, bm: int | None) -> int:
    """Pairs a program of `_exl3_grouped`: each block decodes its expert's whole trellis, so many pairs an expert
    want bigger blocks (H200, TP=1, 8,192 tokens: 39 ms at 128 against 48 ms at 64; 2,048 tokens, 57 pairs an
    expert: 14.3 ms at 64 against 17.7 ms at 128; bench/results/2026-12-02-h200-exl3_prompt.json)."""
    return bm or (128 if pairs >= 128 * experts else 64)


def _block_table(counts: torch.Tensor, bm: int, pairs: int) -> torch.Tensor:
    """[NB, 3] int32 (expert, first, end) over the expert-sorted pairs: each expert's pairs cut into blocks of at
    most bm. NB = ceil(pairs / bm) + E, the most there can be, so the launch shape depends on the pair count alone
    (no host read); blocks past the last have first = end (no work)."""
    experts = counts.shape[0]
    ends = torch.cumsum(counts, 0)
    blocks = (counts + bm - 1) // bm
    block_ends = torch.cumsum(blocks, 0)
    b = torch.arange(-(-pairs // bm) + experts, device=counts.device)
    e = torch.searchsorted(block_ends, b, right=True).clamp_max(experts - 1)
    first = ends[e] - counts[e] + (b - block_ends[e] + blocks[e]) * bm
    live = b < block_ends[-1]
    first = torch.where(live, first, 0)
    end = torch.where(live, torch.minimum(first + bm, ends[e]), 0)
    return torch.stack([e, first, end], 1).to(torch.int32).contiguous()


def _operands_f16(operands: str) -> bool:
    if operands not in ("fp16", "tf32"):
        raise ValueError(f"operands={operands!r}: the grouped MMA takes 'fp16' or 'tf32' operands")
    return operands == "fp16"


def _split_operands(launch: dict) -> bool:
    """Whether the grouped products take x as its two fp16 operands made once (`_store_halves`): with fp16 operands,
    in either form (TF32 operands take x in fp32)."""
    return _operands_f16(launch["operands"])


def _wgmma_applies(launch: dict, device: torch.device) -> bool:
    """Whether `grouped_experts` runs `_exl3_grouped_wgmma`: asked for, fp16 operands, and a Hopper GPU (warpgroup
    MMA is compute capability 9.0's alone; the GB10 and the interpreter run `_exl3_grouped`)."""
    if launch["form"] not in ("wgmma", "dot"):
        raise ValueError(f"form={launch['form']!r}: the grouped product's form is 'wgmma' or 'dot'")
    return (
        launch["form"] == "wgmma"
        and _operands_f16(launch["operands"])
        and device.type == "cuda"
        and torch.version.hip is None  # a ROCm GPU may report 9.0 too
        and not _INTERPRETED
        and torch.cuda.get_device_capability(device) == (9, 0)
    )


def _grouped_grid(table: torch.Tensor, n_blocks: int, mats: int, launch: dict) -> tuple[int, int, int]:
    blocks = table.shape[0]
    return (n_blocks, blocks, mats) if launch["n_first"] else (blocks, n_blocks, mats)


def _grouped_launch(
    xp: torch.Tensor,
    bank: exl3.Exl3Bank,
    table: torch.Tensor,
    mats: int,
    out: torch.Tensor,
    dest: torch.Tensor | None,
    launch: dict,
    wgmma: bool,
) -> None:
    bits2, cb = _format(bank.trellis, bank.codebook)
    _, k_tiles, n_tiles, _ = bank.trellis.shape
    bnt = math.gcd(launch["bnt"], n_tiles)
    grid = _grouped_grid(table, n_tiles // bnt, mats, launch)
    args = (_words(bank.trellis), table, table if dest is None else dest, out)
    shape = dict(K_TILES=k_tiles, N_TILES=n_tiles, WORDS=bits2 * 4, BITS2=bits2, CODEBOOK=cb, BM=launch["bm"], BNT=bnt)
    shape |= dict(MATS=mats, SCATTER=dest is not None, SPLIT_X=launch["split_x"], N_FIRST=launch["n_first"])
    decode = dict(MUL1_SCALE=_MUL1_SCALE, MUL1_BIAS=_MUL1_BIAS, ASM=_asm(None))
    if wgmma:
        warps = launch["wgmma_warps"] or (4 if launch["bm"] <= 64 else 8)
        if warps % 4 or bnt % warps or launch["bm"] not in (64, 128):
            raise ValueError(
                f"the wgmma form takes 64 or 128 pairs a block and whole warpgroups (warps a multiple of 4) whose "
                f"count divides the output tiles a program: {launch['bm']} pairs, {warps} warps, {bnt} tiles"
            )
        head, rest = xp  # `_store_halves`' two operands
        ring = dict(KB=launch["stage_tiles"], STAGES=launch["stages"])
        if k_tiles % (ring["KB"] * ring["STAGES"]):
            raise ValueError(f"{k_tiles} K tiles: the ring's {ring['STAGES']} stages of {ring['KB']} must divide them")
        cap = {} if launch["wgmma_maxnreg"] is None else {"maxnreg": launch["wgmma_maxnreg"]}
        _exl3_grouped_wgmma[grid](head, rest, *args, **shape, **decode, **ring, WARPS=warps, num_warps=warps, **cap)
        return
    ku = launch["ku"] if k_tiles % launch["ku"] == 0 else 1
    f16 = _operands_f16(launch["operands"])
    halves = dict(xl_ptr=xp[1], X16=True) if f16 else {}  # `_split_operands`
    _exl3_grouped[grid](
        xp[0] if f16 else xp, *args, **shape, **decode, KU=ku, PREFETCH=launch["prefetch"], F16=f16, **halves,
        num_warps=launch["num_warps"],
    )  # fmt: skip


def grouped_experts(
    x: torch.Tensor,
    chosen: torch.Tensor,
    weights: torch.Tensor,
    gate_up: exl3.Exl3Bank,
    down: exl3.Exl3Bank,
    limit: float,
    add: Addend = None,
    **launch,
) -> torch.Tensor:
    """`routed_experts` for a prompt chunk: the (row, expert) pairs sorted by expert once, each expert's trellis
    decoded once per block of up to `bm` of its pairs straight into tensor-core operands (`_exl3_grouped_wgmma` on
    Hopper, `_exl3_grouped` elsewhere: `launch["form"]`), no W_q in memory, no host sync. Six launches besides the
    sort: rotate the rows for gate and up (gathered in sorted order), gate‖up, `_swiglu_between`, down (rows
    scattered back to (row, slot) order), `_weighted_sum` (`add` added there). `launch`: options of PROMPT_LAUNCH
    to override."""
    unknown = set(launch) - set(PROMPT_LAUNCH)
    if unknown:
        raise ValueError(f"grouped_experts takes the launch options of PROMPT_LAUNCH, not {sorted(unknown)}")
    launch = {**PROMPT_LAUNCH, **launch}
    rows, k = chosen.shape
    pairs, width, hidden = rows * k, gate_up.svh.shape[-1], down.svh.shape[-1]
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    launch["bm"] = _block_rows(pairs, len(down), launch["bm"])
    table = _block_table(torch.bincount(flat, minlength=len(down)), launch["bm"], pairs)
    warps = launch["rotate_warps"]
    wgmma = _wgmma_applies(launch, x.device)
    split = _split_operands(launch)
    inputs = "natural" if wgmma else "mma"  # the products' input order
    xp = rotate_rows(
        x[None],
        1,
        experts,
        pre=gate_up.suh,
        order=inputs,
        share=2,
        paired=True,
        gather=order // k,
        num_warps=warps,
        block_rows=launch["rotate_rows"],
        split=split,
    )
    h = torch.empty(2 * pairs, width, dtype=torch.float32, device=x.device)
    _grouped_launch(xp, gate_up, table, 2, h, None, launch, wgmma)
    hp = _operands((pairs, width), split, x.device)
    _swiglu_between[(pairs, width // exl3.HADAMARD_BLOCK)](
        h,
        hp,
        experts,
        gate_up.svh,
        down.suh,
        float(limit),
        WIDTH=width,
        PARTS=1,
        ORDER=INPUT_ORDERS[inputs],
        SPLIT=split,
        num_warps=warps,
    )
    y = torch.empty(pairs, hidden, dtype=torch.float32, device=x.device)
    _grouped_launch(hp, down, table, 1, y, order, launch, wgmma)
    return _pairs_summed(y[None], rows, flat, down, weights, add, warps)


def _pairs_summed(
    parts: torch.Tensor,
    rows: int,
    experts: torch.Tensor,
    down: exl3.Exl3Bank,
    weights: torch.Tensor,
    add: Addend = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """`_weighted_sum`: each row's k pairs (parts [PARTS, rows·k, H] in (row, slot) order) rotated back, weighted and
    added in slot order; plus `add` [rows, H] fp32 where given (a callable: called here, just before the launch)."""
    k = weights.shape[-1]
    hidden = down.svh.shape[-1]
    out = torch.empty(rows, hidden, dtype=torch.float32, device=parts.device)
    addend = add() if callable(add) else add
    if addend is not None and (addend.shape != out.shape or addend.dtype != torch.float32):
        raise ValueError(f"the routed sum adds an fp32 [{rows}, {hidden}]; got {addend.dtype} {list(addend.shape)}")
    _weighted_sum[(rows, hidden // exl3.HADAMARD_BLOCK)](
        parts,
        out,
        experts,
        down.svh,
        weights.float().contiguous(),
        out if addend is None else addend.contiguous(),
        WIDTH=hidden,
        PARTS=parts.shape[0],
        K=k,
        KP=1 << (k - 1).bit_length(),
        ADD=addend is not None,
        num_warps=num_warps,
    )
    return out


def routed_experts(
    x: torch.Tensor,
    chosen: torch.Tensor,
    weights: torch.Tensor,
    gate_up: exl3.Exl3Bank,
    down: exl3.Exl3Bank,
    limit: float,
    add: Addend = None,
) -> torch.Tensor:
    """Σ over each row's chosen experts of weight · down(swiglu(gate(x), up(x))) with EXL3 experts: x [T, H] fp32;
    chosen, weights [T, k]; gate_up holds expert e's gate / up as matrices 2e / 2e+1, down expert e as matrix e.
    Returns [T, H] fp32 (this rank's partial sum), as engine/ops/triton_moe.routed_experts does for bf16 experts;
    with `add` (the shared expert's output [T, H] fp32, or a call giving it, made just before the last launch)
    that sum plus it, in the last launch: the bits `add + routed` gives (one fp32 addition), a launch less.

    Up to PAIRS_MAX (row, expert) pairs (decode, verify): every pair through the decode-GEMV, expert ids read on
    the device (no host sync, shapes fixed by T and k: CUDA-graph safe); a row's result depends only on that row.
    More pairs (a prompt chunk): `grouped_experts`, each selected expert decoded once a block of its pairs, on the
    tensor cores."""
    rows, k = chosen.shape
    x = x.float().contiguous()
    if rows * k <= PAIRS_MAX:
        # five launches: rotate x for gate and up, their GEMV, (sum, rotate, SwiGLU, rotate for down), the down
        # GEMV, (sum, rotate, weight, add the row's k pairs in order)
        pairs, width = rows * k, gate_up.svh.shape[-1]
        experts = chosen.reshape(-1)  # on the device; gate / up: matrices 2e, 2e+1
        form = gemv_form(x.device)  # once: both GEMVs and the orders they read
        order = gemv_order(x.device, form)
        xp = rotate_rows(x[None], 1, experts, pre=gate_up.suh, order=order, share=2 * k, paired=True)
        parts = exl3_gemv_parts(xp[:, None], gate_up.trellis, experts, gate_up.codebook, paired=True, form=form)
        hp = torch.empty(pairs, width, dtype=torch.float32, device=x.device)
        _swiglu_between[(pairs, width // exl3.HADAMARD_BLOCK)](
            parts,
            hp,
            experts,
            gate_up.svh,
            down.suh,
            float(limit),
            WIDTH=width,
            PARTS=parts.shape[0],
            ORDER=INPUT_ORDERS[order],
        )
        parts = exl3_gemv_parts(hp[:, None], down.trellis, experts, down.codebook, form=form)
        return _pairs_summed(parts, rows, experts, down, weights, add)
    return grouped_experts(x, chosen, weights, gate_up, down, limit, add=add)


def _dense_apply(x: torch.Tensor, bank: exl3.Exl3Bank, i: int) -> torch.Tensor:
    """x [R, K] @ W[i] for many rows: W_q decoded (exact fp16, transient) and a matmul between the rotations (the
    rotation kernel: one launch each, exl3.rotate's bits)."""
    mats = torch.full((x.shape[0],), i, dtype=torch.int32, device=x.device)
    y = rotate_rows(x[None], 1, mats, pre=bank.suh) @ exl3_unpack(bank.trellis[i], bank.codebook).float()
    return rotate_rows(y[None], 1, mats, post=bank.svh)


def _looped_experts(
    x: torch.Tensor,
    chosen: torch.Tensor,
    weights: torch.Tensor,
    gate_up: exl3.Exl3Bank,
    down: exl3.Exl3Bank,
    limit: float,
) -> torch.Tensor:
    """The first prompt path, kept as the baseline of bench/exl3_prompt_bench.py and the reference of
    tests/gpu/test_exl3_moe_gpu.py: per selected expert (a host read), its W_q decoded whole to fp16 and an fp32
    matmul."""
    from engine.ops.reference import swiglu_clamped

    out = torch.zeros(chosen.shape[0], down.svh.shape[-1], dtype=torch.float32, device=x.device)
    for expert in chosen.unique().tolist():
        token, slot = (chosen == expert).nonzero(as_tuple=True)
        xs = x[token]
        act = swiglu_clamped(_dense_apply(xs, gate_up, 2 * expert), _dense_apply(xs, gate_up, 2 * expert + 1), limit)
        out.index_add_(0, token, _dense_apply(act, down, expert) * weights[token, slot, None].float())
    return out
