"""DSA's prompt attention on the H200's tensor cores (`ops.split_product`, engine/models/glm5_next/dsa.py, taken
with `SparseMLA.TENSOR_CORES`) against the fp32 products the engine runs today, at the real model's head widths:
dense regime and selected tokens. The precision on a whole model is a bench figure (bench/gpu_engine.py
--prompt-candidates). Skipped without a GPU (never part of CI)."""

from __future__ import annotations

import pytest
import torch
from test_prompt_candidates import dsa_heads, relative_error

from engine.models.glm5_next.dsa import SparseMLA

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def layer():
    """GLM-5.3-Flash's per-head widths (nope 192, v 256, latent 512), 16 local heads; the products on the CUDA cores
    in fp32 where `TENSOR_CORES` is off."""
    layer = dsa_heads(heads=16, nope=192, v=256, rank=512)
    kv_b = torch.cat([layer.w_k, layer.w_v], dim=1).cuda() * 0.3
    layer.w_k, layer.w_v = kv_b[:, :192], kv_b[:, 192:]
    yield layer
    SparseMLA.TENSOR_CORES = False  # the default until the path is timed (dsa.py)


def test_prompt_attention_on_tensor_cores_matches_fp32(layer) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    t, length = 512, 1536
    q = torch.randn(t, 16, 192, device="cuda", generator=g)
    latents = torch.randn(length, 512, device="cuda", generator=g).bfloat16().float()  # as a bf16 pool returns them
    positions = torch.arange(length - t, length, device="cuda")
    mask = torch.arange(length, device="cuda")[None, :] <= positions[:, None]
    SparseMLA.TENSOR_CORES = False
    want = layer._attend(q, latents, mask)
    SparseMLA.TENSOR_CORES = True
    for bf16_latents in (False, True):
        got = layer._attend(q, latents, mask, bf16_latents)
        assert 0 < relative_error(got, want) < 5e-5  # > 0: the tensor-core path ran (bits differ from fp32's)

    n = 640
    tokens = torch.randint(0, length, (t, n), device="cuda", generator=g)
    counts = torch.rand(t, n, device="cuda", generator=g) < 0.9
    counts[:, 0] = True
    SparseMLA.TENSOR_CORES = False
    want = layer._attend_selected(q, latents, tokens, counts)
    SparseMLA.TENSOR_CORES = True
    for bf16_latents in (False, True):
        got = layer._attend_selected(q, latents, tokens, counts, bf16_latents)
        assert 0 < relative_error(got, want) < 5e-5


def test_folded_indexer_on_cuda_matches_the_batched_products() -> None:
    """`_index_folded` at a 32k context's shapes (2,048 queries, 32 index heads of 128, 512 pools) against the
    batched matmul and einsum the prompt path runs today."""
    layer = object.__new__(SparseMLA)
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(2048, 32, 128, device="cuda", generator=g)
    keys = torch.randn(1, 512, 128, device="cuda", generator=g)
    head_w = torch.randn(2048, 32, device="cuda", generator=g)
    want = torch.einsum("bh,bhp->bp", head_w, torch.relu(torch.matmul(q, keys.transpose(-1, -2)) * 128**-0.5))
    assert relative_error(layer._index_folded(q, keys, head_w), want) < 1e-5
