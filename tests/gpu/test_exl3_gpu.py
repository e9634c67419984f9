"""The EXL3 Triton kernels compiled for a GPU, against the CPU reference (engine/quant/exl3.py) and exllamav3's own
vectors (tests/fixtures/exl3). Runs on the lent H200 machine (`python -m pytest -q tests/gpu`); skipped without CUDA.
The same checks in Triton's interpreter on the CPU: tests/engine/test_exl3_triton.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exl3"
CUDA = "cuda"


def _random(bits, codebook, k, n, experts=None, bias=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lead = () if experts is None else (experts,)
    trellis = torch.randint(-32768, 32768, (*lead, k // 16, n // 16, int(16 * bits)), generator=gen).to(torch.int16)
    suh = ((torch.rand(*lead, k, generator=gen) + 0.5) * torch.sign(torch.randn(*lead, k, generator=gen))).half()
    svh = ((torch.rand(*lead, n, generator=gen) + 0.5) * torch.sign(torch.randn(*lead, n, generator=gen))).half()
    b = torch.randn(*lead, n, generator=gen).half() if bias else None
    return trellis, suh, svh, b


def _rel_error(y: torch.Tensor, linear, x: torch.Tensor) -> float:
    exact = linear.forward(x.double().cpu())
    return float((y.double().cpu() - exact).abs().max() / exact.abs().max())


def _on_gpu(linear):
    from engine.quant import exl3

    return exl3.Exl3Linear(
        linear.trellis.to(CUDA),
        linear.suh.to(CUDA),
        linear.svh.to(CUDA),
        linear.codebook,
        None if linear.bias is None else linear.bias.to(CUDA),
    )


def test_unpack_is_exllamav3_bit_for_bit():
    from safetensors.torch import load_file

    from engine.ops.triton_exl3 import exl3_unpack
    from engine.quant import exl3

    tiles = load_file(str(FIXTURES / "tiles.safetensors"))
    cases = sorted(n[: -len(".trellis")] for n in tiles if n.endswith(".trellis"))
    assert len(cases) == 27
    for case in cases:
        ours = exl3_unpack(tiles[case + ".trellis"].to(CUDA), case.split("_", 1)[1]).cpu()
        assert torch.equal(ours.view(torch.int16), tiles[case + ".wq"].view(torch.int16)), case
    trellis = _random(4, "mcg", 4096, 2048)[0]
    assert torch.equal(
        exl3_unpack(trellis.to(CUDA), "mcg").cpu().view(torch.int16), exl3.unpack(trellis, "mcg").view(torch.int16)
    )


@pytest.mark.parametrize(
    "bits,codebook,k,n,m",
    [
        (4, "mcg", 4096, 2048, 1),
        (4, "mcg", 2048, 4096, 8),
        (4, "mcg", 4096, 2048, 3),
        (4, "3inst", 512, 256, 5),
        (4, "mul1", 256, 512, 2),
        (2, "mcg", 512, 256, 1),
        (3, "3inst", 256, 256, 4),
        (2.5, "mul1", 256, 256, 7),
        (5, "mcg", 256, 256, 1),
        (8, "3inst", 256, 128, 2),
    ],
)
def test_forward_matches_the_reference(bits, codebook, k, n, m):
    from engine.ops.triton_exl3 import exl3_linear
    from engine.quant import exl3

    trellis, suh, svh, bias = _random(bits, codebook, k, n, bias=True, seed=k + n + m)
    linear = exl3.Exl3Linear(trellis, suh, svh, codebook, bias)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    assert _rel_error(exl3_linear(_on_gpu(linear), x.to(CUDA)), linear, x) < 2e-6 * (k / 256) ** 0.5


@pytest.mark.parametrize("case", ["l4_mcg", "l3_3inst", "l2.5_mul1"])
def test_exllamav3_fixture_layers(case):
    from safetensors.torch import load_file

    from engine.ops.triton_exl3 import exl3_linear
    from engine.quant import exl3

    layers = load_file(str(FIXTURES / "layers.safetensors"))
    linear = exl3.Exl3Linear(
        layers[case + ".trellis"], layers[case + ".suh"], layers[case + ".svh"], case.split("_", 1)[1]
    )
    x = torch.randn(4, linear.in_features, generator=torch.Generator().manual_seed(1))
    assert _rel_error(exl3_linear(_on_gpu(linear), x.to(CUDA)), linear, x) < 2e-6
    # and against exllamav3's own W (its fp16 rotations: ~1.4e-3 of max|W|, see the fixtures' README)
    theirs = x.double() @ layers[case + ".w_had"].double()
    ours = exl3_linear(_on_gpu(linear), x.to(CUDA)).double().cpu()
    assert float((ours - theirs).abs().max() / theirs.abs().max()) < 1e-2


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"split": 1, "unroll": 1},
        {"split": 8, "unroll": 4, "block_n_tiles": 8},
        {"block_n_tiles": 2, "num_warps": 2},
        {"form": "mma"},
    ],
)
def test_expert_bank_selected_on_the_device(kw):
    from engine.ops.triton_exl3 import exl3_matmul
    from engine.quant import exl3

    trellis, suh, svh, bias = _random(4, "mcg", 1024, 512, experts=5, bias=True, seed=3)
    mats = torch.tensor([4, 0, 4, 2], dtype=torch.int32)
    x = torch.randn(4, 3, 1024, generator=torch.Generator().manual_seed(2))
    y = exl3_matmul(x.to(CUDA), trellis.to(CUDA), suh.to(CUDA), svh.to(CUDA), mats.to(CUDA), "mcg", bias.to(CUDA), **kw)
    for g, e in enumerate(mats.tolist()):
        assert _rel_error(y[g], exl3.Exl3Linear(trellis[e], suh[e], svh[e], "mcg", bias[e]), x[g]) < 5e-6


def test_a_rows_result_does_not_depend_on_the_batch():
    from engine.ops.triton_exl3 import exl3_linear
    from engine.quant import exl3

    linear = _on_gpu(exl3.Exl3Linear(*_random(4, "mcg", 2048, 1024, seed=5)[:3], "mcg"))
    x = torch.randn(8, 2048, generator=torch.Generator().manual_seed(6)).to(CUDA)
    together = exl3_linear(linear, x)
    for m in (1, 2, 3, 5):
        assert torch.equal(exl3_linear(linear, x[:m]), together[:m]), m
    for i in range(8):
        assert torch.equal(exl3_linear(linear, x[i : i + 1])[0], together[i]), i


def test_rotation_kernel_is_bitwise_the_reference():
    from engine.ops.triton_exl3 import rotate_rows
    from engine.quant import exl3

    x = torch.randn(6, 4096, generator=torch.Generator().manual_seed(7))
    ours = rotate_rows(x[None].to(CUDA), 1, torch.zeros(6, dtype=torch.int32, device=CUDA)).cpu()
    assert torch.equal(ours, exl3.rotate(x, -1))


def test_prompt_chunk_path():
    from engine.ops.triton_exl3 import exl3_linear
    from engine.quant import exl3

    linear = exl3.Exl3Linear(*_random(4, "mcg", 1024, 512, seed=9)[:3], "mcg")
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(8))
    assert _rel_error(exl3_linear(_on_gpu(linear), x.to(CUDA)), linear, x) < 5e-6


@pytest.mark.parametrize("codebook", ["mcg", "3inst"])
def test_inline_ptx_decode_gives_the_triton_decodes_bits(codebook):
    """The compiled kernels decode through inline PTX (`_decode`, ASM); the Triton form (what the interpreter tests
    check against the reference) must give the same W_q and the same GEMV partials, bit for bit."""
    from engine.ops.triton_exl3 import exl3_gemv_parts, exl3_unpack

    trellis = _random(4, codebook, 1024, 512, experts=2, seed=11)[0].to(CUDA)
    assert torch.equal(
        exl3_unpack(trellis[1], codebook, asm=True).view(torch.int16),
        exl3_unpack(trellis[1], codebook, asm=False).view(torch.int16),
    )
    xp = torch.randn(2, 4, 1024, generator=torch.Generator().manual_seed(12)).to(CUDA)
    mats = torch.tensor([1, 0], dtype=torch.int32, device=CUDA)
    assert torch.equal(
        exl3_gemv_parts(xp, trellis, mats, codebook, asm=True), exl3_gemv_parts(xp, trellis, mats, codebook, asm=False)
    )


def _dispatched_launches():
    """Every format the GEMV decodes × every row count a launch takes × both forms (`triton_exl3.GEMV_FORMS`: the
    FMA form the engine serves with, the tensor-core form kept as an option); ASM on and off where the decode has an
    inline-PTX form (3inst, mcg). The launch shape is what the dispatcher picks for it (BNT by rows and format, the split by K:
    K = 512 splits 2 ways, N = 256 allows 16 tiles a program)."""
    from engine.quant import exl3

    for form in ("fma", "mma"):
        for codebook in exl3.CODEBOOKS:
            for bits in exl3.WIDTHS:
                if not float(bits).is_integer() and codebook != "mul1":
                    continue
                for rows in (1, 2, 4, 8):
                    for asm in (True, False) if codebook != "mul1" else (True,):
                        name = f"{form}-{codebook}-{bits}b-{rows}r-{'asm' if asm else 'tt'}"
                        yield pytest.param(form, codebook, bits, rows, asm, id=name)


@pytest.mark.parametrize("form,codebook,bits,rows,asm", list(_dispatched_launches()))
def test_every_format_and_row_count_the_dispatcher_launches_gives_the_cpu_decoders_product(
    form, codebook, bits, rows, asm
):
    """Issue 20: mul1 at 5 and 3.5 bits with one row and 16 tiles a program summed wrongly (40-70 % off) while the
    tests covered neither; the dispatcher now avoids that launch, and this covers every case it can choose, in both
    forms."""
    from engine.ops.triton_exl3 import GEMV_LAUNCH, _config, exl3_gemv_parts, gemv_order, kernel_order
    from engine.quant import exl3

    k, n = 512, 256
    gen = torch.Generator().manual_seed(int(bits * 10) + rows)
    trellis = torch.randint(-32768, 32768, (1, k // 16, n // 16, int(16 * bits)), generator=gen).to(torch.int16)
    x = torch.randn(1, rows, k, generator=gen)
    mats = torch.zeros(1, dtype=torch.int32, device=CUDA)
    assert gemv_order(torch.device(CUDA), form) == ("natural" if form == "mma" else "gemv")
    xp = x if form == "mma" else kernel_order(x)
    parts = exl3_gemv_parts(xp.to(CUDA), trellis.to(CUDA), mats, codebook, asm=asm, form=form)
    unroll = GEMV_LAUNCH[form]["unroll"]
    assert parts.shape[0] == _config(k // 16, n // 16, None, None, unroll, rows)[1] == 2  # K split as served
    exact = x[0].double() @ exl3.unpack(trellis[0], codebook).double()
    got = parts.sum(0)[0].double().cpu()
    assert float((got - exact).abs().max() / exact.abs().max()) < 1e-5


def test_the_mma_form_gives_each_row_its_own_bits_whatever_its_column():
    """Drafts need a row's partials to be the same bits alone and beside up to 7 other rows, in any of the MMA's 8
    columns, and the served expert bank's groups (`paired`) to be the single matrices' products."""
    from engine.ops.triton_exl3 import exl3_gemv_parts

    trellis = _random(4, "mcg", 2048, 1024, experts=6, seed=13)[0].to(CUDA)
    x = torch.randn(4, 8, 2048, generator=torch.Generator().manual_seed(14)).to(CUDA)
    mats = torch.tensor([2, 0], dtype=torch.int32, device=CUDA)
    together = exl3_gemv_parts(x, trellis, mats, "mcg", paired=True, form="mma")  # matrices 4, 5, 0, 1
    for g, matrix in enumerate((4, 5, 0, 1)):
        one = torch.tensor([matrix], dtype=torch.int32, device=CUDA)
        for m in range(8):
            alone = exl3_gemv_parts(x[g : g + 1, m : m + 1], trellis, one, "mcg", form="mma")
            assert torch.equal(alone[:, 0, 0], together[:, g, m]), (g, m)
        shifted = exl3_gemv_parts(x[g : g + 1, [3, 0, 1, 2]][:, :4], trellis, one, "mcg", form="mma")
        assert torch.equal(shifted[:, 0, 1], together[:, g, 0])


def test_routed_experts_in_both_forms_agree():
    """The MoE's decode path with the tensor-core GEMV (its rows in their natural order, `_swiglu_between` storing
    down's input so) against the FMA form the engine serves with: the same experts' sums to fp32-close."""
    from engine.ops import triton_exl3 as tx
    from engine.quant import exl3

    gen = torch.Generator().manual_seed(15)
    banks = []
    for matrices, k, n in ((2 * 6, 512, 256), (6, 256, 512)):
        trellis, suh, svh, _ = _random(4, "mcg", k, n, experts=matrices, seed=k + matrices)
        banks.append(exl3.Exl3Bank(trellis.to(CUDA), suh.to(CUDA), svh.to(CUDA), "mcg"))
    x = torch.randn(3, 512, generator=gen).to(CUDA)
    chosen = torch.tensor([[0, 5], [2, 3], [5, 1]], device=CUDA)
    weights = torch.rand(3, 2, generator=gen).to(CUDA)
    outs = {}
    for form in tx.GEMV_FORMS:
        tx.LAUNCH_DEFAULTS["form"] = form
        try:
            outs[form] = tx.routed_experts(x, chosen, weights, *banks, 10.0)
        finally:
            tx.LAUNCH_DEFAULTS.pop("form")
    assert float((outs["mma"] - outs["fma"]).abs().max() / outs["fma"].abs().max()) < 2e-5
