"""Exact speculative decoding on the GPU: the row invariance and rejection checks of tests/engine/test_drafts.py on
CUDA, eager and replayed from CUDA graphs (captured per batch, window width and span), fp32 and bf16 weights.
Runs on the lent H200 machine (PYTHONPATH=.:tests/engine python -m pytest -q tests/gpu); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference
from test_drafts import (
    test_a_rejected_draft_leaves_every_state_bit_as_if_never_proposed as rejected_draft_check,
)
from test_drafts import (
    test_a_rows_logits_do_not_depend_on_window_width_or_neighbours as row_invariance_check,
)

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    # measured on the H200 (docs/BENCHMARKS.md, session 6): cuBLAS products and batched einsums change a row's bits
    # with the rows beside it, so drafts are refused on CUDA; strict, so the day these pass the refusal is lifted
    pytest.mark.xfail(strict=True, reason="the CUDA decode step is not row-invariant yet (drafts refused on GPUs)"),
]


@pytest.fixture(scope="module", params=["kda3_dsa1", "dsa_heavy"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make_reference(path, request.param, seed=3)
    return path


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def model(request, checkpoint):
    return Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dtype=request.param)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_rows_are_invariant_on_cuda(model, graphs):
    row_invariance_check(model, graphs)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_rejected_drafts_leave_no_trace_on_cuda(model, graphs):
    rejected_draft_check(model, graphs)
