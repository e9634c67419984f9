"""The split-bf16 product behind the DSA prompt path on CUDA (`ops.split_product`): close to fp32, far closer than
one bf16 product, and the DSA attention written with it agrees with the fp32 einsums it replaces on the GPU.

It runs here on the CPU, where each bf16 partial product is computed in fp32 (exact products, fp32 sums) - the
same arithmetic the tensor cores do, in a different summation order; tests/gpu/test_dsa_split_gpu.py checks the
CUDA path against the fp32 one on the H200."""

from __future__ import annotations

import torch

from engine import ops
from engine.models.glm5_next.dsa import SparseMLA


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


def test_split_product_is_near_fp32_and_far_better_than_bf16() -> None:
    g = torch.Generator().manual_seed(0)
    for shape_a, shape_b in (((96, 512), (512, 80)), ((4, 33, 192), (4, 192, 512))):
        a, b = torch.randn(shape_a, generator=g), torch.randn(shape_b, generator=g)
        exact = a.double() @ b.double()
        split = ops.split_product(a, b)
        assert split.dtype == torch.float32 and split.shape == exact.shape
        one_bf16 = a.bfloat16().float() @ b.bfloat16().float()
        assert relative_error(split, exact) < 3e-5
        assert relative_error(one_bf16, exact) > 30 * relative_error(split, exact)
    # operands given already split give the same result
    a, b = torch.randn(8, 64, generator=g), torch.randn(64, 16, generator=g)
    assert torch.equal(ops.split_product(ops.split_bf16(a), ops.split_bf16(b)), ops.split_product(a, b))


def test_split_bf16_parts_sum_to_the_value() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 1e3
    hi, lo = ops.split_bf16(x)
    assert hi.dtype == lo.dtype == torch.bfloat16
    assert relative_error(hi.float() + lo.float(), x) < 2**-15
    assert relative_error(hi.float(), x) > 2**-12  # the low part carries real information


def dsa_heads(heads: int = 4, nope: int = 24, v: int = 16, rank: int = 64) -> SparseMLA:
    """A SparseMLA holding only what its attention reads (random absorbed kv_b), not loaded from a checkpoint."""
    g = torch.Generator().manual_seed(2)
    layer = object.__new__(SparseMLA)
    layer.local_heads, layer.nope, layer.v_dim, layer.rank_dim = heads, nope, v, rank
    layer.scaling = (nope + 8) ** -0.5
    layer.w_k = torch.randn(heads, nope, rank, generator=g) * 0.2
    layer.w_v = torch.randn(heads, v, rank, generator=g) * 0.2
    return layer


def test_dsa_prompt_attention_split_matches_the_fp32_einsums() -> None:
    layer = dsa_heads()
    g = torch.Generator().manual_seed(3)
    t, length = 40, 56
    q = torch.randn(t, layer.local_heads, layer.nope, generator=g)
    latents = torch.randn(length, layer.rank_dim, generator=g)
    positions = torch.arange(length - t, length)
    mask = torch.arange(length)[None, :] <= positions[:, None]
    want = layer._attend(q, latents, mask)  # the CPU keeps the fp32 einsums
    got = layer._attend_split(q, latents, mask)
    assert got.shape == want.shape == (t, layer.local_heads * layer.v_dim)
    assert relative_error(got, want) < 5e-5

    # the sparse regime: each query's own gathered latents, some not counted
    n = 24
    tokens = torch.randint(0, length, (t, n), generator=g)
    counts = torch.rand(t, n, generator=g) < 0.8
    counts[:, 0] = True
    want = layer._attend_lanes(q, latents[tokens], counts)
    hi, lo = ops.split_bf16(latents)
    got = layer._attend_gathered_split(q, hi[tokens], lo[tokens], counts)
    assert relative_error(got, want) < 5e-5
