"""`_exl3_grouped_wgmma` (engine/ops/triton_exl3.py: a prompt chunk's EXL3 experts on Hopper's warpgroup MMA, W_q
decoded straight into the register operand) is a Gluon kernel, which Triton's CPU interpreter cannot run: here it is
compiled for the H200 (sm_90) at the real model's expert shapes with the launches `grouped_experts` picks (64 or 128
pairs a block) and the variants the bench and GPU tests run (8 warps, 16 output tiles a program).
The kernel states `gl.convert_layout(w, operand, assert_trivial=True)`, so a compile is also the check that the
decoded values are the MMA's A fragment as they stand (no shared-memory round trip for W_q, the point of the form).
Its numbers against the expert loop and the dot form: tests/gpu/test_exl3_moe_gpu.py."""

from __future__ import annotations

import re

import pytest
import torch

HIDDEN, WIDTH = 4096, 2048  # GLM-5.3-Flash's routed experts (TP=1; TP=2 halves the width)


def compile_gluon(fn, pointers: dict, const: dict, capability: int, warps: int):
    """A Gluon kernel compiled for GPUTarget("cuda", capability) without a GPU: `pointers` its pointer arguments'
    types (16-byte aligned), `const` every other argument (all of them: the kernel's constexprs are checked)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {n: pointers.get(n, "constexpr") for n in fn.arg_names}
    assert set(signature) - set(pointers) == set(const), "the kernel's constexprs changed"
    source = GluonASTSource(
        fn=fn,
        signature=signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
        attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in pointers},
    )
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": warps})


def _compile(**const):
    pytest.importorskip("triton")
    from engine.ops import triton_exl3 as tx

    stages = {"KB": tx.PROMPT_LAUNCH["stage_tiles"], "STAGES": tx.PROMPT_LAUNCH["stages"]}
    const = {"MUL1_SCALE": tx._MUL1_SCALE, "MUL1_BIAS": tx._MUL1_BIAS, "ASM": True, **stages, **const}
    pointers = {"xh_ptr": "*fp16", "xl_ptr": "*fp16", "t_ptr": "*i32", "block_ptr": "*i32", "dest_ptr": "*i32"}
    pointers["out_ptr"] = "*fp32"
    return compile_gluon(tx._exl3_grouped_wgmma, pointers, const, 90, const["WARPS"])


# (K, N, MATS, SCATTER): gate‖up and down at TP=1 and at TP=2's shard, and TP=3's uneven shards (6 and 5 Hadamard
# blocks of 128: gate‖up's 768 and 640 outputs, down's 48 and 40 K tiles, which the ring's 8 tiles a turn divide)
SHAPES = [
    (HIDDEN, WIDTH, 2, False),
    (WIDTH, HIDDEN, 1, True),
    (HIDDEN, WIDTH // 2, 2, False),
    (WIDTH // 2, HIDDEN, 1, True),
    (HIDDEN, 768, 2, False),
    (HIDDEN, 640, 2, False),
    (768, HIDDEN, 1, True),
    (640, HIDDEN, 1, True),
]


@pytest.mark.parametrize(("k", "n", "mats", "scatter"), SHAPES)
@pytest.mark.parametrize(("bm", "bnt", "warps"), [(64, 8, 4), (64, 8, 8), (128, 8, 8), (64, 16, 8)])
def test_the_wgmma_form_compiles_with_w_in_registers(k, n, mats, scatter, bm, bnt, warps):
    kernel = _compile(
        K_TILES=k // 16,
        N_TILES=n // 16,
        WORDS=32,
        BITS2=8,
        CODEBOOK=1,
        BM=bm,
        BNT=bnt,
        MATS=mats,
        SCATTER=scatter,
        SPLIT_X=True,
        WARPS=warps,
        N_FIRST=True,
    )
    ptx = kernel.asm["ptx"]
    assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx
    # the A operand from registers: after the accumulators, wgmma's A is a list of four registers (W_qᵀ's fp16 pairs),
    # then B's shared-memory descriptor (with A in shared memory it would be a second descriptor)
    products = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bm}k16\.f32\.f16\.f16 \{{[^}}]*\}}, (\S+) %rd", ptx)
    assert products and all(re.fullmatch(r"\{%r\d+,%r\d+,%r\d+,%r\d+\},", a) for a in products), products[:2]
    # shared memory: the ring of x's fp16 head and remainder (reused for the accumulator's trip to the store layout),
    # within a quarter of an SM's so that four programs fit (the register cap lets four run)
    from engine.ops import triton_exl3 as tx

    ring = tx.PROMPT_LAUNCH["stages"] * tx.PROMPT_LAUNCH["stage_tiles"]
    assert kernel.metadata.shared == 2 * ring * bm * 16 * 2, kernel.metadata.shared
    assert bm == 128 or kernel.metadata.shared <= 57 * 1024
    # asynchronous products: a tile's MMAs left in flight (wait for all but the two just issued) while the next
    # tile is decoded, and x copied into shared memory without registers
    assert "wgmma.wait_group.sync.aligned 2;" in ptx and "cp.async" in ptx


@pytest.mark.parametrize(
    ("bits2", "codebook", "split_x"), [(6, 1, True), (7, 2, True), (10, 0, True), (8, 2, True), (8, 1, False)]
)
def test_every_width_and_codebook_compiles(bits2, codebook, split_x):
    kernel = _compile(
        K_TILES=64,
        N_TILES=32,
        WORDS=4 * bits2,
        BITS2=bits2,
        CODEBOOK=codebook,
        BM=64,
        BNT=8,
        MATS=2,
        SCATTER=False,
        SPLIT_X=split_x,
        WARPS=4,
        N_FIRST=False,
    )
    assert "wgmma.mma_async" in kernel.asm["ptx"]


def test_the_form_is_chosen_by_the_device_and_checked():
    pytest.importorskip("triton")
    from engine.ops import triton_exl3 as tx

    launch = dict(tx.PROMPT_LAUNCH)
    assert launch["form"] == "wgmma"
    assert not tx._wgmma_applies(launch, torch.device("cpu"))  # the CPU and the interpreter run the dot form
    with pytest.raises(ValueError, match="'wgmma' or 'dot'"):
        tx._wgmma_applies({**launch, "form": "mma"}, torch.device("cpu"))
    with pytest.raises(ValueError, match="'fp16' or 'tf32'"):
        tx._wgmma_applies({**launch, "operands": "bf16"}, torch.device("cpu"))
    # a launch option grouped_experts does not have is refused, not ignored (a bench variant would time the default)
    x, chosen, weights = torch.zeros(4, 256), torch.zeros(4, 2, dtype=torch.long), torch.ones(4, 2)
    with pytest.raises(ValueError, match=r"not \['wgmma_ku'\]"):
        tx.grouped_experts(x, chosen, weights, None, None, 10.0, wgmma_ku=2)
