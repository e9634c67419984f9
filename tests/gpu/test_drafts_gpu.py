"""Exact speculative decoding on the GPU: the row invariance and rejection checks of tests/engine/test_drafts.py on
CUDA, eager and replayed from CUDA graphs (captured per batch, window width and span), fp32 and bf16 weights, and
drafted ≡ serial through the scheduler on the trained demo.
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
from test_drafts import (
    test_drafted_replies_equal_serial_replies as drafted_equals_serial_check,
)

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
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


@pytest.fixture(scope="module")
def demo_cuda():
    import json

    from tokenizers import Tokenizer

    from engine.checkpoint.demo import TRAINED

    model = Glm5NextForCausalLM.load(TRAINED, ParallelGroup.single("cuda"))  # bf16, the serving dtype
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    eos = frozenset(json.loads((TRAINED / "config.json").read_text())["text_config"]["eos_token_id"])
    return model, tokenizer, eos


@pytest.mark.parametrize("parallel,stagger", [(4, False), (3, True)])
def test_drafted_equals_serial_through_the_scheduler_on_cuda(demo_cuda, parallel, stagger):
    """The trained demo in bf16 with CUDA graphs (captured per batch, window width and span), copy drafts against
    "draft": false through the real scheduler."""
    drafted_equals_serial_check(demo_cuda, parallel, stagger, graphs=True)


@pytest.fixture(scope="module")
def exl3_model(tmp_path_factory):
    from engine.checkpoint.demo import write_demo

    path = write_demo(tmp_path_factory.mktemp("exl3demo"), seed=0, size="exl3", fmt="exl3")
    return Glm5NextForCausalLM.load(path, ParallelGroup.single("cuda"))


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_rows_are_invariant_with_exl3_experts(exl3_model, graphs):
    """The served format: routed experts through the EXL3 decode-GEMV (one program per (row, expert) pair)."""
    row_invariance_check(exl3_model, graphs)


def test_rows_are_invariant_at_full_width():
    """GLM-5.3-Flash's own widths (bench/gpu_engine.py's 4-layer KKKD build, random bf16 weights): lane 0's logits
    decoded alone, beside three lanes, and as rows of a verify window beside three lanes, with graphs. The tiny
    configs above passed with fewer paddings than these widths need (torch's reductions split long rows)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "bench"))
    from gpu_engine import build, prompt_ids

    from engine.runner.lanes import LaneDecoder

    model, cfg = build("KKKD", "cuda", root / "engine/checkpoint/glm53_flash_config.json")
    pool = model.make_pool(4096, "bf16")
    ids = prompt_ids(cfg, 128)

    def fresh(batch):
        decoder = LaneDecoder(model, pool, 4, graphs=True, window=5)
        seqs = [decoder.new_sequence(lane) for lane in range(batch)]
        for i, seq in enumerate(seqs):
            model.prefill(seq, ids[i:] + ids[:i])
        return decoder, seqs

    with torch.no_grad():
        tokens = [11, 12, 13, 14]
        decoder, seqs = fresh(1)
        serial = [decoder.decode([seqs[0]], [t])[0] for t in tokens]
        for seq in seqs:
            seq.release()
        decoder, seqs = fresh(4)
        beside = decoder.decode(seqs, [11, 20, 21, 22])[0]
        for seq in seqs:
            seq.release()
        decoder, seqs = fresh(4)
        rows = decoder.verify(seqs, [tokens, [20, 21], [22], [23, 24, 25]])[0]
        for seq in seqs:
            seq.release()
    assert decoder.uses_graphs
    assert torch.equal(beside, serial[0])
    for t in range(4):
        assert torch.equal(rows[t], serial[t]), f"verify row {t}"
