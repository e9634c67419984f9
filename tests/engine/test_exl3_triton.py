"""The EXL3 Triton kernels (engine/ops/triton_exl3.py) in Triton's interpreter, on the CPU, against the reference
decoder (engine/quant/exl3.py) and exllamav3's own vectors (tests/fixtures/exl3).

Triton reads TRITON_INTERPRET when it is first imported, so the kernels run in a child process started with it set
(this file run as a script prints every case's figures as JSON); the tests assert on them. Skipped where Triton is
not installed (CI installs only pyproject's dependencies). The same checks on a GPU: tests/gpu/test_exl3_gpu.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from interpreter import figures_of

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "exl3"

# (bits, codebook, K, N, rows, bias): every codebook, integer and half-integer widths, the dense 4-bit path and the
# per-value path, 1..8 rows (padded to 1, 2, 4, 8 inside)
FORWARD_CASES = [
    (4, "mcg", 256, 128, 1, False),
    (4, "3inst", 128, 256, 3, True),
    (4, "mul1", 128, 128, 8, False),
    (2, "mcg", 128, 128, 2, False),
    (3, "3inst", 128, 128, 1, True),
    (2.5, "mul1", 128, 128, 5, False),
    (6, "mcg", 128, 128, 1, False),
]
TOLERANCE = 2e-6  # of max |y|: fp32 sums over K <= 256 products differ from fp64 by ~2e-7 of it


def _cases() -> dict:
    """Run in the child (TRITON_INTERPRET=1): every figure the tests check."""
    import torch
    from safetensors.torch import load_file

    from engine.ops import triton_exl3 as tx
    from engine.quant import exl3

    gen = torch.Generator().manual_seed(8)
    out: dict = {}

    def error(y: torch.Tensor, linear: exl3.Exl3Linear, x: torch.Tensor) -> dict:
        exact = linear.forward(x.double())
        scale = float(exact.abs().max())
        return {
            "kernel": float((y.double() - exact).abs().max()) / scale,
            "reference_fp32": float((linear.forward(x.float()).double() - exact).abs().max()) / scale,
        }

    def random_linear(bits, codebook, k, n, bias, experts=None):
        lead = () if experts is None else (experts,)
        trellis = torch.randint(-32768, 32768, (*lead, k // 16, n // 16, int(16 * bits)), generator=gen)
        suh = (torch.rand(*lead, k, generator=gen) + 0.5) * torch.sign(torch.randn(*lead, k, generator=gen))
        svh = (torch.rand(*lead, n, generator=gen) + 0.5) * torch.sign(torch.randn(*lead, n, generator=gen))
        b = torch.randn(*lead, n, generator=gen).half() if bias else None
        return trellis.to(torch.int16), suh.half(), svh.half(), b

    # W_q bit for bit: exllamav3's 27 tiles, and a larger random matrix at the served width
    tiles = load_file(str(FIXTURES / "tiles.safetensors"))
    for name in sorted(n for n in tiles if n.endswith(".trellis")):
        case = name[: -len(".trellis")]
        ours = tx.exl3_unpack(tiles[name], case.split("_", 1)[1])
        out.setdefault("tiles", {})[case] = int((ours.view(torch.int16) != tiles[case + ".wq"].view(torch.int16)).sum())
    trellis = random_linear(4, "mcg", 128, 256, False)[0]
    out["unpack_random_4bit_differ"] = int(
        (tx.exl3_unpack(trellis, "mcg").view(torch.int16) != exl3.unpack(trellis, "mcg").view(torch.int16)).sum()
    )

    # forward against Exl3Linear.forward
    for bits, codebook, k, n, m, bias in FORWARD_CASES:
        linear = exl3.Exl3Linear(
            *random_linear(bits, codebook, k, n, False)[:3],
            codebook,
            torch.randn(n, generator=gen).half() if bias else None,
        )
        x = torch.randn(m, k, generator=gen)
        out.setdefault("forward", {})[f"{bits}-{codebook}-{m}"] = error(tx.exl3_linear(linear, x), linear, x)

    # exllamav3's layers (suh / svh as it made them)
    layers = load_file(str(FIXTURES / "layers.safetensors"))
    for case in ("l4_mcg", "l3_3inst", "l2.5_mul1"):
        linear = exl3.Exl3Linear(
            layers[case + ".trellis"], layers[case + ".suh"], layers[case + ".svh"], case.split("_", 1)[1]
        )
        x = torch.randn(2, linear.in_features, generator=gen)
        out.setdefault("fixture_layers", {})[case] = error(tx.exl3_linear(linear, x), linear, x)

    # a bank of experts, each group its own expert (ids on the "device"), split-K and unroll variants agree
    trellis, suh, svh, bias = random_linear(4, "mcg", 256, 128, True, experts=3)
    mats = torch.tensor([2, 0, 2], dtype=torch.int32)
    x = torch.randn(3, 2, 256, generator=gen)
    worst = 0.0
    for kw in ({}, {"split": 1, "unroll": 1}, {"split": 4, "unroll": 2, "block_n_tiles": 8}):
        y = tx.exl3_matmul(x, trellis, suh, svh, mats, "mcg", bias, **kw)
        for g, e in enumerate(mats.tolist()):
            linear = exl3.Exl3Linear(trellis[e], suh[e], svh[e], "mcg", bias[e])
            worst = max(worst, error(y[g], linear, x[g])["kernel"])
    out["bank_worst"] = worst

    # a row's result alone and among 8 rows: the same bits
    linear = exl3.Exl3Linear(*random_linear(4, "mcg", 256, 128, False)[:3], "mcg")
    x = torch.randn(8, 256, generator=gen)
    together = tx.exl3_linear(linear, x)
    out["rows_alone_differ"] = int(sum((tx.exl3_linear(linear, x[i : i + 1])[0] != together[i]).sum() for i in (0, 5)))

    # the Hadamard kernel gives exl3.rotate's bits, one row a program or several (the last program's rows partly
    # past the end), and as the grouped products use it: gathered rows, each feeding a pair of matrices, pre-scaled
    x = torch.randn(3, 256, generator=gen)
    out["rotate_differ"] = {
        rows: int(
            (tx.rotate_rows(x[None], 1, torch.zeros(3, dtype=torch.int32), block_rows=rows) != exl3.rotate(x, -1)).sum()
        )
        for rows in (1, 2, 4)
    }
    pre = torch.rand(8, 256, generator=gen).half()
    ids, gather = torch.tensor([3, 1, 0, 2, 1]), torch.tensor([2, 0, 1, 1, 2])
    mats = 2 * ids.repeat_interleave(2) + torch.arange(10) % 2  # paired: output row r, matrix 2 ids[r // 2] + r % 2
    expected = exl3.rotate(x[gather].repeat_interleave(2, 0) * pre[mats].float(), -1)
    out["rotate_gathered_differ"] = {
        rows: int(
            (
                tx.rotate_rows(x[None], 1, ids, pre=pre, share=2, paired=True, gather=gather, block_rows=rows)
                != expected
            ).sum()
        )
        for rows in (1, 4, 8)
    }

    # the same rotation, and the SwiGLU between the grouped products, written as the warpgroup form's two fp16
    # operands: the fp32 form's values rounded to fp16, and their remainders rounded, bit for bit
    def halves(y: torch.Tensor) -> torch.Tensor:
        head = y.half()
        return torch.stack([head, (y - head.float()).half()])

    split = tx.rotate_rows(x[None], 1, ids, pre=pre, share=2, paired=True, gather=gather, block_rows=4, split=True)
    out["rotate_split_differ"] = int((split.view(torch.int16) != halves(expected).view(torch.int16)).sum())
    gate_up, down = torch.randn(10, 256, generator=gen), (torch.rand(4, 256, generator=gen) + 0.5).half()
    svh = (torch.rand(8, 256, generator=gen) + 0.5).half()
    swiglu = {}
    for form in (False, True):
        h = tx._operands((5, 256), form, gate_up.device)
        tx._swiglu_between[(5, 2)](gate_up, h, ids, svh, down, 10.0, WIDTH=256, PARTS=1, ORDER=0, SPLIT=form)
        swiglu[form] = h
    out["swiglu_split_differ"] = int((swiglu[True].view(torch.int16) != halves(swiglu[False]).view(torch.int16)).sum())

    # a prompt chunk's routed experts in the form other GPUs than Hopper run (`_exl3_grouped`'s tl.dot): with fp16
    # operands x comes as its two fp16 operands made once; against the expert loop, and the TF32 form (fp32 x)
    experts, hidden, width = 8, 256, 128
    bank_gu = random_linear(4, "mcg", hidden, width, False, experts=2 * experts)
    bank_d = random_linear(4, "mcg", width, hidden, False, experts=experts)
    gate_up = exl3.Exl3Bank(*bank_gu[:3], "mcg")
    down = exl3.Exl3Bank(*bank_d[:3], "mcg")
    x = torch.randn(24, hidden, generator=gen)
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:3] for _ in range(24)])
    weights = torch.rand(24, 3, generator=gen)
    looped = tx._looped_experts(x, chosen, weights, gate_up, down, 10.0)
    scale = float(looped.abs().max())
    out["grouped_dot"] = {
        operands: float((tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0, operands=operands) - looped)
                        .abs().max()) / scale
        for operands in ("fp16", "tf32")
    }  # fmt: skip

    # a prompt chunk (more than 8 rows): exact fp16 W_q, torch matmul
    linear = exl3.Exl3Linear(*random_linear(4, "mcg", 128, 128, False)[:3], "mcg")
    x = torch.randn(12, 128, generator=gen)
    out["prompt_chunk"] = error(tx.exl3_linear(linear, x), linear, x)
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    return figures_of(__file__)


def test_unpack_matches_exllamav3_bit_for_bit(results: dict) -> None:
    assert len(results["tiles"]) == 27
    assert {case: n for case, n in results["tiles"].items() if n} == {}
    assert results["unpack_random_4bit_differ"] == 0


@pytest.mark.parametrize("case", [f"{b}-{c}-{m}" for b, c, _, _, m, _ in FORWARD_CASES])
def test_forward_matches_the_reference_within_fp32(results: dict, case: str) -> None:
    err = results["forward"][case]
    assert err["kernel"] <= TOLERANCE and err["reference_fp32"] <= TOLERANCE, err


def test_exllamav3_fixture_layers(results: dict) -> None:
    for case, err in results["fixture_layers"].items():
        assert err["kernel"] <= TOLERANCE, (case, err)


def test_expert_bank_and_split_variants(results: dict) -> None:
    assert results["bank_worst"] <= TOLERANCE


def test_a_rows_result_does_not_depend_on_the_batch(results: dict) -> None:
    assert results["rows_alone_differ"] == 0


def test_rotation_kernel_is_bitwise_the_reference(results: dict) -> None:
    assert results["rotate_differ"] == {"1": 0, "2": 0, "4": 0}
    assert results["rotate_gathered_differ"] == {"1": 0, "4": 0, "8": 0}
    assert results["rotate_split_differ"] == 0
    assert results["swiglu_split_differ"] == 0


def test_grouped_prompt_experts_in_the_dot_form(results: dict) -> None:
    assert results["grouped_dot"]["fp16"] <= 1e-4, results["grouped_dot"]
    assert results["grouped_dot"]["tf32"] <= 1e-4, results["grouped_dot"]


def test_prompt_chunk_path(results: dict) -> None:
    assert results["prompt_chunk"]["kernel"] <= TOLERANCE


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, str(ROOT))
    print(json.dumps(_cases()))
