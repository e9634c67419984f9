"""MTP drafts on the GPU: the checks of tests/engine/test_mtp.py on CUDA with graphs (the MTP step captured per
batch, window, chain and span beside the verify step), on the trained demo in bf16 — drafted ≡ serial through the
scheduler with mtp and mtp+copy, a rejected MTP draft leaving no trace in the layer's cache, and under formats the
MTP step's first draft one the format allows (its mask read by the captured step in place).
Runs on the lent H200 machine (PYTHONPATH=.:tests/engine:tests python -m pytest -q tests/gpu); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from test_mtp import test_a_rejected_mtp_draft_leaves_no_trace_in_its_cache as no_trace_check
from test_mtp import test_mtp_drafted_replies_equal_serial_replies as drafted_equals_serial_check
from test_structured import grammars  # noqa: F401
from test_structured import test_the_mtp_layers_first_draft_is_one_the_format_allows as masked_draft_check

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def demo_mtp_cuda():
    import json

    from tokenizers import Tokenizer

    from engine.checkpoint.demo import TRAINED

    model = Glm5NextForCausalLM.load(TRAINED, ParallelGroup.single("cuda"), mtp=True)  # bf16, the serving dtype
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    eos = frozenset(json.loads((TRAINED / "config.json").read_text())["text_config"]["eos_token_id"])
    return model, tokenizer, eos


@pytest.mark.parametrize("drafter,parallel,stagger", [("mtp", 4, False), ("mtp+copy", 3, True)])
def test_mtp_drafted_equals_serial_on_cuda(demo_mtp_cuda, drafter, parallel, stagger):
    drafted_equals_serial_check(demo_mtp_cuda, drafter, parallel, stagger, graphs=True)


@pytest.mark.parametrize("graphs", [False, True])
def test_a_rejected_mtp_draft_leaves_no_trace_on_cuda(demo_mtp_cuda, graphs):
    no_trace_check(demo_mtp_cuda, graphs)


def test_the_first_mtp_draft_takes_the_formats_mask_on_cuda(demo_mtp_cuda, grammars, monkeypatch):  # noqa: F811
    masked_draft_check(demo_mtp_cuda, grammars, monkeypatch, graphs=True)
