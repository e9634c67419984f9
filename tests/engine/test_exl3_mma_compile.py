"""`_exl3_gemv_mma` (engine/ops/triton_exl3.py: the EXL3 decode GEMV on the tensor cores, each decoded tile the
first operand of `mma.sync`) is a Gluon kernel, which Triton's CPU interpreter cannot run: here it is compiled for
the H200 (sm_90) and the GB10 (sm_121) at the real model's expert shapes with the launch the engine takes and the
sweep's variants, and for every width and codebook. The kernel states `gl.convert_layout(w, a_l,
assert_trivial=True)`, so a compile is also the check that the decoded values are the MMA's A fragment as they stand
(no shared memory at all). Its numbers against the CPU decoder, both forms: tests/gpu/test_exl3_gpu.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # every test here compiles (and `_served` reads the engine's Triton launch)

from test_exl3_wgmma_compile import compile_gluon  # noqa: E402

HIDDEN, WIDTH = 4096, 2048  # GLM-5.3-Flash's routed experts (TP=1; TP=2 halves the width)


def _compile(capability: int = 90, warps: int = 4, **const):
    pytest.importorskip("triton")
    from engine.ops import triton_exl3 as tx

    base = {"MUL1_SCALE": tx._MUL1_SCALE, "MUL1_BIAS": tx._MUL1_BIAS, "ASM": True, "PAIRED": False, "WARPS": warps}
    pointers = {"x_ptr": "*fp32", "t_ptr": "*i32", "mat_ptr": "*i32", "out_ptr": "*fp32"}
    return compile_gluon(tx._exl3_gemv_mma, pointers, {**base, **const}, capability, warps)


def _served(k: int, n: int, rows: int, launch: dict) -> dict:
    from engine.ops import triton_exl3 as tx

    bnt, split, unroll = tx._config(k // 16, n // 16, launch["block_n_tiles"], None, launch["unroll"], rows)
    return dict(K_TILES=k // 16, N_TILES=n // 16, WORDS=32, BITS2=8, CODEBOOK=1, ROWS=rows, BNT=bnt, SPLIT=split)


# (K, N, PAIRED): gate‖up and down at TP=1 and at TP=2's shard
SHAPES = [(HIDDEN, WIDTH, True), (WIDTH, HIDDEN, False), (HIDDEN, WIDTH // 2, True), (WIDTH // 2, HIDDEN, False)]


@pytest.mark.parametrize("capability", [90, 121])
@pytest.mark.parametrize(("k", "n", "paired"), SHAPES)
@pytest.mark.parametrize("rows", [1, 8])
def test_the_served_launch_compiles_with_no_shared_memory(capability, k, n, paired, rows):
    from engine.ops import triton_exl3 as tx

    launch = tx.GEMV_LAUNCH["mma"]
    kernel = _compile(
        capability,
        launch["num_warps"],
        **_served(k, n, rows, launch),
        KU=launch["unroll"],
        PAIRED=paired,
    )
    ptx = kernel.asm["ptx"]
    assert f".target sm_{capability}" in ptx and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert kernel.metadata.shared == 0, kernel.metadata.shared


@pytest.mark.parametrize(("bnt", "warps", "unroll"), [(8, 2, 1), (16, 4, 2), (16, 2, 4), (8, 4, 4)])
def test_the_sweeps_launches_compile(bnt, warps, unroll):
    kernel = _compile(
        90, warps, K_TILES=256, N_TILES=64, WORDS=32, BITS2=8, CODEBOOK=1, ROWS=4, BNT=bnt, SPLIT=16, KU=unroll
    )
    assert "mma.sync" in kernel.asm["ptx"]


@pytest.mark.parametrize(("bits2", "codebook"), [(4, 1), (6, 0), (7, 2), (10, 1), (16, 0), (8, 2), (8, 0)])
def test_every_width_and_codebook_compiles(bits2, codebook):
    kernel = _compile(
        90, 4, K_TILES=32, N_TILES=16, WORDS=4 * bits2, BITS2=bits2, CODEBOOK=codebook, ROWS=2, BNT=8, SPLIT=2, KU=4
    )
    assert "mma.sync" in kernel.asm["ptx"]


def test_the_form_follows_the_device_and_refuses_what_it_does_not_know():
    pytest.importorskip("triton")
    from engine.ops import triton_exl3 as tx

    cpu = torch.device("cpu")
    assert tx.gemv_form(cpu) == "fma" and tx.gemv_order(cpu) == "gemv"  # the interpreter's form off CUDA
    assert tx.gemv_form(cpu, "fma") == "fma"
    assert tx.gemv_form(cpu, "mma") == "fma" and tx.gemv_order(cpu, "mma") == "gemv"  # where it cannot run
    tx.LAUNCH_DEFAULTS["form"] = "mma"
    try:
        assert tx.gemv_form(cpu) == "fma"
    finally:
        tx.LAUNCH_DEFAULTS.pop("form")
    with pytest.raises(ValueError, match="forms are"):
        tx.gemv_form(cpu, "wgmma")
