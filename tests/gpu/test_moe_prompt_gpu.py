"""The MoE of a prompt chunk on the GPU: bf16 experts as two grouped GEMMs over the stacked bank (tokens sorted by
expert once) against the loop over experts they replace. (A whole prompt's logits are not compared: on a random tiny
model the bf16 rounding of the grouped products moved a few near-tied argmaxes, and the bound depended on whether
fla-core ran the KDA prompt; the layer bound below is what the two paths must share.)
Runs on the lent H200 machine (PYTHONPATH=.:tests/engine:tests python -m pytest -q tests/gpu); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference

from engine.models.glm5_next import moe
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe_prompt")
    make_reference(path, "kda3_dsa1", seed=3)
    return Glm5NextForCausalLM.load(path, ParallelGroup.single("cuda"))  # bf16 experts, stacked


def both_ways(fn):
    try:
        moe.GROUPED_GEMM = True
        grouped = fn()
        assert moe.GROUPED_GEMM, "the grouped GEMMs fell back to the loop"
        moe.GROUPED_GEMM = False
        return grouped, fn()
    finally:
        moe.GROUPED_GEMM = True


@torch.no_grad()
def test_grouped_experts_match_the_loop(model):
    layer = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, moe.MoE))
    x = torch.randn(700, model.cfg.hidden_size, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    grouped, loop = both_ways(lambda: layer(x))
    # the grouped GEMMs round gate‖up and down to bf16 where the loop keeps fp32 products: a few bf16 ulps
    assert (grouped - loop).abs().max() <= 1e-2 * loop.abs().max()


@torch.no_grad()
def test_grouped_experts_give_the_same_bits_every_time(model):
    """A prompt's logits may not depend on the run: the pairs' outputs go back to token order and are summed in a
    fixed order (an index_add_ over the sorted pairs adds by atomics; at full width two prefills of one prompt gave
    logits 0.012 apart). Many tokens per expert, every token's k pairs colliding on its row."""
    layer = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, moe.MoE))
    x = torch.randn(2048, model.cfg.hidden_size, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    first = layer(x)
    assert moe.GROUPED_GEMM
    for _ in range(5):
        assert torch.equal(layer(x), first)
