"""engine/ops/triton_dense.py on the CPU. `_dense_rows` is a Gluon kernel, which Triton's CPU interpreter cannot run:
here it is compiled for the H200 (sm_90) and the GB10 (sm_121) at the launch shapes of the real model's weights, q4
and fp8, and must take no shared memory but the word its split-input count passes on (its operands go from memory
straight into the tensor cores' registers: the point of its layout) and run on mma.sync; what it computes — the nibbles as 128 + q, e4m3 as fp16, each group's
product scaled once — is checked against the dequantised weight in torch. Its numbers, row invariance and graphs on
the GPU: tests/gpu/test_dense_gpu.py.

`_dequantize` (a prompt chunk's weight made bf16 in one launch) is a Triton kernel: it runs in Triton's interpreter in
a child process (tests/engine/interpreter.py; this file run as a script prints the figures) and must give
`QuantWeight.dequantize`'s bits."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from interpreter import figures_of

from engine.quant.dense import QuantWeight, quantize, tiled_shape

ROOT = Path(__file__).resolve().parents[2]

# [out, in] of GLM-5.3-Flash's dense weights (bench/dense_bench.py's shapes at TP=1 and 2) and two small ones, one
# with an input width groups do not divide (fp8 only: a last, shorter group)
SHAPES = [(24896, 4096), (4096, 8192), (2336, 4096), (16384, 1536), (154880, 4096), (4096, 2048), (96, 1024)]


def _compiled(
    mode: str,
    out: int,
    width: int,
    sigma: bool,
    tile: int,
    capability: int,
    seen: set | None = None,
    whole: bool | None = None,
):
    """`_dense_rows` compiled for sm_`capability` as `dense_rows` launches it on a weight of that shape and mode
    (`launch_shape`'s form, the MMA's rows in σ order or not, `tile` the weight's TILE or 0, `whole` a tiled weight
    from a tile's first row read from one base a block, None the table's choice at one row); None for a form compiled
    already."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from engine.ops import triton_dense as td

    fn = td._dense_rows
    fp8 = mode == "fp8"
    launch = td.launch_shape(out, width, 64, fp8) | dict(sigma=sigma)
    per_split = -(-width // launch["splits"] // 64) * 64
    const = dict(K=width, K_PER_SPLIT=per_split, SPLITS=launch["splits"], GROUP=64, FP8=fp8, BLOCK_O=launch["block_o"])
    const |= dict(ROWS=td.ROWS, KW=launch["kw"], WARPS=launch["num_warps"], UNROLL=launch["unroll"], SIGMA=sigma)
    form = launch if whole is None else launch | dict(whole_from=int(whole))  # the table's form, or one forced
    const |= dict(TILE=tile, WHOLE_TILES=td.whole_tiles(form, 1, bool(tile)))
    if seen is not None:
        if tuple(const.items()) in seen:
            return None
        seen.add(tuple(const.items()))
    # fp8 read as bytes; q4's scales as QuantWeight.words, a group's scale and offset an output in one word
    pointers = {"x_ptr": "*fp32", "w_ptr": "*u8", "s_ptr": "*fp32" if fp8 else "*i32"}
    pointers |= {"out_ptr": "*fp32", "count_ptr": "*i32"}
    signature = {n: "constexpr" if n in const else pointers.get(n, "i32") for n in fn.arg_names}
    # strides, and the outputs' count, that divide by 16 (as Triton's launcher marks them)
    divisible = [n for n in fn.arg_names if n in pointers or (n.startswith("stride") and width % 16 == 0)]
    divisible += ["OUT"] if out % 16 == 0 else []
    source = GluonASTSource(
        fn=fn,
        signature=signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
        attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible},
    )
    return launch["splits"], triton.compile(
        source, target=GPUTarget("cuda", capability, 32), options={"num_warps": launch["num_warps"]}
    )


@pytest.mark.parametrize("capability", [90, 121])
def test_the_kernel_compiles_to_registers_only_mma(capability):
    pytest.importorskip("triton")
    from engine.ops import triton_dense as td

    seen = set()
    # a tiled weight (as `quantize` keeps it) in both forms: its blocks whole tiles, and a slice from inside a tile
    forms = [(m, s, sigma, whole) for m in ("q4", "fp8") for s in SHAPES for sigma in (False, True) for whole in (1, 0)]
    for mode, (out, width), sigma, whole in forms + [("fp8", (80, 200), True, 1)]:
        tile = td.TILE if tiled_shape(out, width) else 0
        compiled = _compiled(mode, out, width, sigma, tile, capability, seen, whole=bool(whole))
        if compiled is None:
            continue
        splits, kernel = compiled
        fp8 = mode == "fp8"
        ptx = kernel.asm["ptx"]
        # split inputs: the slices' count goes through one shared word (the atomic's result, to every thread) and
        # the last program sums the slices; unsplit: no shared memory, no atomics
        assert kernel.metadata.shared == (4 if splits > 1 else 0), (mode, out, width)
        assert ("atom.global.gpu.acq_rel.add" in ptx) == (splits > 1), (mode, out, width)
        assert "mma.sync.aligned.m16n8k16" in ptx and "wgmma" not in ptx and f".target sm_{capability}" in ptx
        assert ("cvt.rn.f16x2.e4m3x2" if fp8 else "prmt.b32") in ptx
        assert "ld.global.b16" not in ptx  # q4: no scale or offset loaded alone
        if sigma and out % 16 == 0 and width % 16 == 0:
            # the MMA's rows in σ order (`_sigma`): a thread's outputs side by side, so its scales load as one
            # vector and its sums store (and a split's partial sums load back) as vectors, none a word at a time
            for scalar in ("ld.global.b32", "st.global.b32", "ld.global.cg.b32"):
                assert scalar not in ptx, (mode, out, width, scalar)
            assert "st.global.v4.b32" in ptx and "ld.global.v4.b32" in ptx, (mode, out, width)
        if not sigma:  # the MMA's rows in the outputs' order: a thread's outputs 8 apart, a word each
            assert "st.global.b32" in ptx and "st.global.v4.b32" not in ptx, (mode, out, width)
    assert len(seen) >= 12  # the split, warps and unrolling vary with the shape; each in both row orders


@pytest.mark.parametrize("mode", ["q4", "fp8"])
def test_a_tiled_weight_loads_as_one_in_rows_does(mode):
    """The tiled layout moves where a group's bytes lie, not how they load: the kernel compiled for a tiled weight
    (whole, or a slice from inside a tile) issues the same global loads, vectors as wide, as for the same weight in
    rows (kda_in_proj, sm_90)."""
    pytest.importorskip("triton")
    import collections
    import re

    from engine.ops import triton_dense as td

    loads = []
    for tile, whole in ((0, True), (td.TILE, True), (td.TILE, False)):
        _, kernel = _compiled(mode, 24896, 4096, mode == "fp8", tile, 90, whole=whole)
        loads.append(collections.Counter(re.findall(r"ld\.global[\w.]*", kernel.asm["ptx"])))
    assert loads[0] == loads[1] == loads[2] and loads[0]["ld.global.v2.b32"] >= 16, loads


def test_the_q4_unpacking_and_algebra_give_the_dequantised_product():
    """What the kernel computes for q4, in torch: each byte's nibbles as 128 + q (the bits 0x43, q), the low and high
    nibbles' products with the group's inputs 0..31 and 32..63, then s·Σ x(128 + q) + (z − 128 s)·Σ x per group,
    against the product with the dequantised weight."""
    w = quantize(torch.randn(40, 256, generator=torch.Generator().manual_seed(3)) * 0.02, "q4")
    assert isinstance(w, QuantWeight) and w.offset is not None
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4)).double()
    codes = w.data.int()  # [out, in/2] (output-major)
    as_bf16 = [((0x43 << 8) | (codes & 15)), ((0x43 << 8) | (codes >> 4))]  # the bf16 bits _Q4_UNPACK makes
    lo, hi = (b.to(torch.int16).view(torch.bfloat16).double() for b in as_bf16)
    assert torch.equal(lo - 128, (codes & 15).double()) and torch.equal(hi - 128, (codes >> 4).double())
    got = torch.zeros(5, 40, dtype=torch.float64)
    for g in range(256 // 64):
        half = slice(g * 32, (g + 1) * 32)  # the group's bytes: inputs 0..31 low, 32..63 high
        xl, xh = x[:, g * 64 : g * 64 + 32], x[:, g * 64 + 32 : (g + 1) * 64]
        p = xl @ lo[:, half].t() + xh @ hi[:, half].t()
        s, z = w.scale[g].double(), w.offset[g].double()
        got += p * s + (z - 128 * s) * (xl.sum(1) + xh.sum(1))[:, None]
    exact = x @ w.dequantize(torch.float64).t()
    assert (got - exact).abs().max() <= 1e-12 * exact.abs().max()


def test_the_fp8_values_are_exact_in_fp16_and_each_group_is_scaled_once():
    """fp8: every e4m3 value is an fp16 one (the kernel's conversion loses nothing), and Σ_g s_g·Σ x·v over the
    groups, a last shorter group included, is the product with the dequantised weight."""
    every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = every[every.isfinite()]
    assert torch.equal(finite.half().float(), finite)
    w = quantize(torch.randn(24, 200, generator=torch.Generator().manual_seed(5)) * 0.02, "fp8")
    assert isinstance(w, QuantWeight) and w.data.shape == (24, 200)
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(6)).double()
    values = w.data.float().half().double()  # [out, in]
    got = sum(x[:, g : g + 64] @ values[:, g : g + 64].t() * w.scale[g // 64].double() for g in range(0, 200, 64))
    exact = x @ w.dequantize(torch.float64).t()  # its v·s rounded to fp32: within that rounding
    assert (got - exact).abs().max() <= 1e-6 * exact.abs().max()


@pytest.mark.parametrize("capability", [90, 121])
@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("mode", ["q4", "fp8"])
def test_the_dequantising_kernel_compiles_unfused_to_registers_only(mode, tiled, capability):
    """As `dequantized` launches it (bf16, enable_fp_fusion=False), a tiled weight's too: q4's product and sum stay
    two rounded steps (no fma.rn.f32, the option honoured), no shared memory (the scales are loaded in the bytes' own
    layout) and the bf16 rows stored as 16-byte vectors."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.ops import triton_dense as td

    fn, fp8 = td._dequantize, mode == "fp8"
    const = dict(GROUP=64, FP8=fp8, BF16=True, BLOCK_O=td.DEQUANT_O, GROUPS=td.DEQUANT_GROUPS)
    const |= dict(TILE=td.TILE if tiled else 0)
    pointers = {"w_ptr": "*u8", "s_ptr": "*fp32" if fp8 else "*fp16", "z_ptr": "*fp32" if fp8 else "*fp16"}
    pointers |= {"out_ptr": "*bf16"}
    signature = {n: "constexpr" if n in const else pointers.get(n, "i32") for n in fn.arg_names}
    source = ASTSource(
        fn=fn,
        signature=signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
        attrs={
            (i,): [["tt.divisibility", 16]]
            for i, n in enumerate(fn.arg_names)
            if n not in const and n not in ("OUT", "step_s")  # step_s: 2 (q4's pairs) or 1
        },
    )
    options = {"num_warps": td.DEQUANT_WARPS, "enable_fp_fusion": False}
    kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    ptx = kernel.asm["ptx"]
    assert kernel.metadata.shared == 0 and "st.global.v4.b32" in ptx and f".target sm_{capability}" in ptx
    assert "fma.rn.f32" not in ptx and "mul.rn.f32" in ptx and ("add.rn.f32" in ptx) != fp8


# (mode, [out, in], the output rows taken or None): whole groups (q4, fp8) and a width they do not divide (fp8: a last,
# shorter group), output and group counts no tile divides, row slices as a column-split rank holds them (views); the
# tiled ones (`tiled_shape`: whole groups, whole tiles but for under 1 %) with slices starting inside a tile and
# across tiles
DEQUANTISED = [
    ("q4", (96, 256), None),
    ("q4", (130, 320), None),
    ("q4", (96, 256), (13, 80)),
    ("q4", (256, 128), (13, 200)),
    ("fp8", (96, 256), None),
    ("fp8", (70, 328), None),
    ("fp8", (70, 328), (5, 66)),
    ("q4", (12328, 128), None),
    ("q4", (12328, 128), (12188, 12318)),
    ("fp8", (384, 128), (77, 300)),
]


def _name(mode: str, shape: tuple[int, int], rows: tuple[int, int] | None) -> str:
    return f"{mode}-{shape[0]}x{shape[1]}" + (f"-rows{rows[0]}:{rows[1]}" if rows else "")


def _figures() -> dict:
    """Run in the child (TRITON_INTERPRET=1): whether `dequantized` gave `dequantize`'s bits, by case and dtype."""
    from engine.ops.triton_dense import dequantized

    out = {}
    for i, (mode, shape, rows) in enumerate(DEQUANTISED):
        w = quantize(torch.randn(*shape, generator=torch.Generator().manual_seed(i)).bfloat16() * 0.02, mode)
        assert isinstance(w, QuantWeight) and w.tiled == tiled_shape(*shape)
        if rows:
            w = w.rows(*rows)
        for dtype in (torch.bfloat16, torch.float32):
            got, want = dequantized(w, dtype), w.dequantize(dtype)
            out[f"{_name(mode, shape, rows)}-{str(dtype)[6:]}"] = bool(
                got.dtype == dtype and got.shape == want.shape and torch.equal(got, want)
            )
    return out


@pytest.fixture(scope="module")
def dequantised() -> dict:
    return figures_of(__file__)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("case", DEQUANTISED, ids=lambda c: _name(*c))
def test_the_dequantising_kernel_gives_the_dequantised_bits(dequantised, case, dtype):
    assert dequantised[f"{_name(*case)}-{dtype}"]


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(ROOT))
    print(json.dumps(_figures()))
