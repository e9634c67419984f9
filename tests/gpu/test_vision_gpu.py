"""The vision tower and image prompts on the GPU (the lent H200; skipped elsewhere): the tower in bf16 against the
fp32 CPU tower, and image requests through the real scheduler with CUDA graphs and copy drafts equal to the same
requests without drafts, alone and batched (tests/engine/test_vision.py checks the CPU path against transformers)."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference
from test_vision import GRIDS, TOWER, image_prompt, pixels, run_requests

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.models.glm5_next.vision import VisionTower
from engine.parallel import ParallelGroup

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def cuda_pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("vision_gpu")
    make_reference(path, "kda3_dsa1", seed=3, vision=TOWER)
    return (
        path,
        VisionTower.load(path, torch.device("cuda")),
        Glm5NextForCausalLM.load(path, ParallelGroup.single("cuda")),
    )


def test_the_bf16_tower_on_cuda_follows_the_fp32_one(cuda_pair):
    path, tower, _ = cuda_pair
    patches = pixels(GRIDS, 1)
    exact = VisionTower.load(path, torch.device("cpu")).forward(patches, GRIDS)
    ours = tower.forward(patches.cuda(), GRIDS).float().cpu()
    assert tower.dtype == torch.bfloat16
    assert (ours - exact).abs().max() <= 0.05 * exact.abs().max()


def test_image_requests_with_graphs_and_drafts_equal_serial(cuda_pair):
    _, tower, model = cuda_pair
    prompts = [image_prompt(seed) for seed in (31, 32, 33)]
    requests = [(ids, images) for ids, images, _ in prompts]
    serial = run_requests(model, tower, requests, parallel=1, graphs=True, drafter="copy", draft=False)
    drafted = run_requests(model, tower, requests, parallel=3, graphs=True, drafter="copy")
    assert [r[0] for r in drafted] == [r[0] for r in serial]
