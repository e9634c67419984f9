"""The model on CUDA (and TP=2 over NCCL) gives the CPU reference's greedy tokens. Runs on the lent H200 machine:
    python -m pytest -q tests/gpu
Skipped where no GPU is present (never part of CI)."""

from __future__ import annotations

import pytest
import torch

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup
from reference import make_reference
from test_parity import ours_greedy, prompt
from test_tensor_parallel import run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu")
    make_reference(path, "kda3_dsa1", seed=2)
    return path


def test_cuda_greedy_equals_cpu(checkpoint):
    cpu = Glm5NextForCausalLM.load(checkpoint)
    gpu = Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"))
    ids = prompt(seed=4)
    cpu_tokens, cpu_logits = ours_greedy(cpu, ids, 32)
    gpu_tokens, gpu_logits = ours_greedy(gpu, ids, 32)
    assert gpu_tokens == cpu_tokens
    assert max(float((a - b.cpu()).abs().max()) for a, b in zip(cpu_logits, gpu_logits)) < 1e-3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for NCCL")
def test_nccl_tp2_equals_tp1(checkpoint, tmp_path):
    ranks = run_ranks(checkpoint, 2, tmp_path, device="cuda")
    cpu = run_ranks(checkpoint, 1, tmp_path)[0]
    for r in ranks:
        assert r["tokens"] == cpu["tokens"]
    assert torch.equal(ranks[0]["logits"], ranks[1]["logits"])
