"""The model on CUDA (and TP=2 over NCCL) gives the CPU reference's greedy tokens. Runs on the lent H200 machine:
    python -m pytest -q tests/gpu
Skipped where no GPU is present (never part of CI)."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference
from test_parity import ours_greedy, prompt
from test_tensor_parallel import assert_nccl_tp2_equals_cpu

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.parallel import ParallelGroup

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu")
    make_reference(path, "kda3_dsa1", seed=2)
    return path


def test_cuda_greedy_equals_cpu(checkpoint):
    cpu = Glm5NextForCausalLM.load(checkpoint)
    gpu = Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dtype=torch.float32)
    ids = prompt(seed=4)
    cpu_tokens, cpu_logits = ours_greedy(cpu, ids, 32)
    gpu_tokens, gpu_logits = ours_greedy(gpu, ids, 32)
    assert gpu_tokens == cpu_tokens
    assert max(float((a - b.cpu()).abs().max()) for a, b in zip(cpu_logits, gpu_logits)) < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chained_hyper_connections_give_the_unchained_bits(checkpoint, dtype):
    """A GPU step's `_hc_post` also makes the next hyper-connection's partial sums (one launch fewer a sublayer);
    the model's logits are the very bits of the three-launch form, in a prompt of a step's size and in decode steps."""
    from test_parity import ours_greedy as greedy

    from engine.ops import triton_mhc

    class Counted:  # `_hc_dots` launches: the chain must be taken, not only give the same bits
        def __init__(self, kernel) -> None:
            self.kernel, self.launches = kernel, 0

        def __getitem__(self, grid):
            self.launches += 1
            return self.kernel[grid]

    model = Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dtype=dtype)
    ids = prompt(seed=5)[:40]  # at most DECODE_TOKENS: the prompt takes the step's form too
    counted = Counted(triton_mhc._hc_dots)
    triton_mhc._hc_dots = counted
    try:
        chained_tokens, chained = greedy(model, ids, 12)
        chained_launches, counted.launches = counted.launches, 0
        links = [(hc, hc.next) for layer in model.layers for hc in (layer.attn_hc, layer.ffn_hc)]
        assert all(nxt is not None for _, nxt in links[:-1]) and links[-1][1] is None
        for hc, _ in links:
            hc.next = None
        tokens, unchained = greedy(model, ids, 12)
    finally:
        triton_mhc._hc_dots = counted.kernel
    assert chained_tokens == tokens
    assert all(torch.equal(a, b) for a, b in zip(chained, unchained))
    forwards = 1 + 12  # the prompt and the decode steps: the first layer's attention alone makes its own sums
    assert (chained_launches, counted.launches) == (forwards, forwards * len(links))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for NCCL")
def test_nccl_tp2_equals_tp1(checkpoint, tmp_path):
    assert_nccl_tp2_equals_cpu(checkpoint, tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_kernel_equals_the_per_expert_loop(dtype):
    """The Triton routed-experts kernel against plain matmuls per (row, expert), same weights and rows."""
    from engine.ops.reference import swiglu_clamped
    from engine.ops.triton_moe import routed_experts

    gen = torch.Generator(device="cuda").manual_seed(0)
    experts, hidden, inter, rows, k = 16, 256, 96, 4, 4
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=gen, device="cuda") / 16).to(dtype)
    down = (torch.randn(experts, hidden, inter, generator=gen, device="cuda") / 10).to(dtype)
    x = torch.randn(rows, hidden, generator=gen, device="cuda")
    chosen = torch.randint(0, experts, (rows, k), generator=gen, device="cuda")
    weights = torch.rand(rows, k, generator=gen, device="cuda")
    out = routed_experts(x, chosen, weights, gate_up, down, 10.0)
    expected = torch.zeros_like(out)
    for r in range(rows):
        for j in range(k):
            e = int(chosen[r, j])
            gate, up = (gate_up[e].float() @ x[r]).chunk(2)
            expected[r] += weights[r, j] * (down[e].float() @ swiglu_clamped(gate, up, 10.0))
    assert (out - expected).abs().max() < 1e-3 * expected.abs().max()
    single = routed_experts(x[1:2], chosen[1:2], weights[1:2], gate_up, down, 10.0)
    assert torch.equal(single[0], out[1]), "a row's result must not depend on the rest of the batch"


def test_sinkhorn_kernel_equals_the_torch_loop():
    from engine.ops.triton_mhc import sinkhorn

    comb = torch.softmax(torch.randn(7, 4, 4, device="cuda"), dim=-1) + 1e-6
    expected = comb / (comb.sum(-2, keepdim=True) + 1e-6)
    for _ in range(19):
        expected = expected / (expected.sum(-1, keepdim=True) + 1e-6)
        expected = expected / (expected.sum(-2, keepdim=True) + 1e-6)
    assert (sinkhorn(comb, 20, 1e-6) - expected).abs().max() < 1e-6
