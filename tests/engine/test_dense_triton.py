"""engine/ops/triton_dense.py (the DENSE=q4 / fp8 products of decode rows and verify windows) in Triton's interpreter,
on the CPU: against the dequantised product (the interpreter's operands are fp16, triton_dense.INTERPRETED), a row's
bits the same alone and among others, a weight whose inputs the launch splits. Triton reads TRITON_INTERPRET when
first imported, so the kernel runs in a child process (this file as a script, tests/engine/interpreter.py). On the
GPU, with bf16 operands: tests/gpu/test_dense_gpu.py."""

from __future__ import annotations

import json

import pytest
import torch
from interpreter import figures_of

from engine.quant.dense import QuantWeight, quantize

KERNEL_CASES = [("q4", 96, 256), ("q4", 40, 1024), ("fp8", 80, 200), ("fp8", 33, 640)]  # [out, in]; splits at 1024


def _kernel_figures() -> dict:
    from engine.ops import triton_dense

    out = {}
    for mode, o, k in KERNEL_CASES:
        w = quantize(torch.randn(o, k, generator=torch.Generator().manual_seed(o)) * 0.02, mode)
        assert isinstance(w, QuantWeight)
        x = torch.randn(20, k, generator=torch.Generator().manual_seed(k))
        got = triton_dense.dense_rows(x, w)
        # the interpreter's operands are fp16 (triton_dense.INTERPRETED): the rows and the dequantised weights rounded
        exact = x.half().double() @ w.dequantize(torch.half).double().t()
        out[f"{mode}-{o}x{k}"] = {
            "error": float((got.double() - exact).abs().max() / exact.abs().max()),
            "splits": triton_dense.launch_shape(o, k, mode == "fp8", w.group)["splits"],
            "invariant": all(
                torch.equal(triton_dense.dense_rows(x[s : s + n], w), got[s : s + n])
                for n, s in ((1, 0), (1, 19), (3, 5), (17, 2))
            ),
        }
    return out


@pytest.fixture(scope="module")
def kernel_figures() -> dict:
    return figures_of(__file__)


def test_the_kernel_equals_the_dequantised_product_and_is_row_invariant(kernel_figures):
    assert set(kernel_figures) == {f"{m}-{o}x{k}" for m, o, k in KERNEL_CASES}
    assert any(f["splits"] > 1 for f in kernel_figures.values()), "a case must split the inputs"
    for name, f in kernel_figures.items():
        assert f["error"] < 1e-5, name
        assert f["invariant"], name


if __name__ == "__main__":
    print(json.dumps(_kernel_figures()))
