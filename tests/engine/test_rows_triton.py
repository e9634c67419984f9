"""engine/ops/triton_rows.py (fp32 products of decode rows and verify windows, row-invariant without padding) in
Triton's interpreter, on the CPU: against the float64 product, a row's bits the same alone and among others, one
weight and head-by-head weights read through a strided view. The kernel runs in a child process (Triton reads
TRITON_INTERPRET when first imported: tests/engine/interpreter.py); on the GPU: tests/gpu/test_rows_gpu.py."""

from __future__ import annotations

import json

import pytest
import torch
from interpreter import figures_of

# (name, x [N, P, K], w [P, O, K] as the kernel reads it)
CASES = ("router", "heads_transposed", "heads")


def _case(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(len(name))
    if name == "router":  # one fp32 weight [40, 300] (K not a power of two: the last input slice masked)
        return torch.randn(12, 1, 300, generator=g), torch.randn(1, 40, 300, generator=g)
    if name == "heads_transposed":  # DSA's bhd,hdr: w_k [h, d, r] read as [h, r, d] through its transpose
        w_k = torch.randn(3, 24, 32, generator=g)
        return torch.randn(12, 3, 24, generator=g), w_k.transpose(1, 2)
    return torch.randn(12, 3, 32, generator=g), torch.randn(3, 20, 32, generator=g)  # bhr,hvr


def _kernel_figures() -> dict:
    from engine.ops import triton_rows

    out = {}
    for name in CASES:
        x, w = _case(name)
        got = triton_rows.rows_product(x, w)
        exact = torch.einsum("npk,pok->npo", x.double(), w.double())
        out[name] = {
            "error": float((got.double() - exact).abs().max() / exact.abs().max()),
            "shape": list(got.shape),
            "invariant": all(
                torch.equal(triton_rows.rows_product(x[s : s + n], w), got[s : s + n])
                for n, s in ((1, 0), (1, 11), (3, 4), (7, 5))
            ),
        }
    return out


@pytest.fixture(scope="module")
def kernel_figures() -> dict:
    return figures_of(__file__)


def test_the_kernel_equals_the_product_and_is_row_invariant(kernel_figures):
    assert set(kernel_figures) == set(CASES)
    for name, f in kernel_figures.items():
        x, w = _case(name)
        assert f["shape"] == [x.shape[0], w.shape[0], w.shape[1]], name
        assert f["error"] < 1e-6, name
        assert f["invariant"], name


if __name__ == "__main__":
    print(json.dumps(_kernel_figures()))
