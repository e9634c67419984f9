"""KDA prompts on a GPU through fla-core's chunk_kda (engine/ops/fla_kda.py): the same outputs and final state as
the token-by-token delta rule, and a model whose KDA heads fla-core takes gives the CPU reference's greedy tokens.
Runs on the lent H200 machine with fla-core importable (bench/gpu_prompt_run.sh); skipped without a GPU or fla-core
(never part of CI)."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference
from test_parity import ours_greedy, prompt

from engine import ops
from engine.models.glm5_next.kda import kda_steps
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.ops import fla_kda
from engine.parallel import ParallelGroup

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not fla_kda.usable(torch.device("cuda"), 16),
    reason="needs a CUDA GPU and fla-core",
)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def inputs(tokens: int, heads: int, dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    q = ops.l2norm(draw(tokens, heads, dim)) * dim**-0.5
    k = ops.l2norm(draw(tokens, heads, dim))
    g = -5.0 * torch.sigmoid(draw(tokens, heads, dim))  # the bounded gate's range (lower_bound -5)
    return draw(heads, dim, dim) * 0.1, q, k, draw(tokens, heads, dim), g, torch.sigmoid(draw(tokens, heads))


@pytest.mark.parametrize("tokens", [1, 77, 300, 1000])
@torch.no_grad()
def test_chunk_kda_equals_token_steps(tokens):
    # one head shape for every case, the model's below: fla-core autotunes each new one (about 1.5 minutes on an
    # H200); bench/kda_prompt_bench.py measures the full-width shape
    heads, dim = 6, 16
    state, *rest = inputs(tokens, heads, dim, seed=tokens)
    before = state.clone()
    out, final = fla_kda.kda_chunked(state, *rest)
    want_out, want_final = kda_steps(state, *rest)
    assert torch.equal(state, before), "the caller's state must not change"
    print(f"T={tokens} H={heads} d={dim}: out {rel(out, want_out):.2e}, state {rel(final, want_final):.2e}")
    assert rel(out, want_out) < 1e-4 and rel(final, want_final) < 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("kda16")
    make_reference(path, "kda3_dsa1", seed=2, linear_head_dim=16)  # a width fla-core's tiles take
    return path


@torch.no_grad()
def test_cuda_greedy_with_fla_prompts_equals_cpu(checkpoint):
    cpu = Glm5NextForCausalLM.load(checkpoint)
    gpu = Glm5NextForCausalLM.load(checkpoint, ParallelGroup.single("cuda"), dtype=torch.float32)
    assert (cpu.kda_prompt_form, gpu.kda_prompt_form) == ("chunked", "fla")
    ids = prompt(seed=4, length=150)  # past two 64-token chunks
    cpu_tokens, cpu_logits = ours_greedy(cpu, ids, 24)
    for chunk in (None, 7, 64):  # whole, and prompts that carry the state from chunk to chunk
        gpu_tokens, gpu_logits = ours_greedy(gpu, ids, 24, chunk=chunk)
        assert gpu_tokens == cpu_tokens, f"chunk {chunk}"
        assert max(float((a - b.cpu()).abs().max()) for a, b in zip(cpu_logits, gpu_logits)) < 1e-3
