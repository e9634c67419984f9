"""Structured outputs on the GPU: the trained demo in bf16 with CUDA graphs through the real scheduler, replies
under JSON-schema, regex and choice formats (masks applied to CUDA logits on rank 0) obey them, and drafted ≡
serial ≡ alone. Runs on the lent H200 machine (PYTHONPATH=.:tests/engine python -m pytest -q tests/gpu, with
xgrammar importable); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from test_drafts_gpu import demo_cuda  # noqa: F401  (the trained demo on CUDA, bf16)
from test_structured import grammars  # noqa: F401
from test_structured import (
    test_replies_under_formats_obey_them_drafted_equal_serial_batched_equal_alone as formats_check,
)

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_formats_hold_with_drafts_and_graphs_on_cuda(demo_cuda, grammars):  # noqa: F811
    formats_check(demo_cuda, grammars, graphs=True)
