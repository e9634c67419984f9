"""The prompt path's CUDA forms, each against the arithmetic it replaced (measured on the H200 in session 16:
docs/BENCHMARKS.md):
- `ops.split_product` (fp32 operands as bf16 hi + lo on the tensor cores): close to fp32, far closer than one bf16
  product; DSA's prompt attention written with it (`SparseMLA._on_tensor_cores`), with latents split or taken as
  bf16;
- KDA's causal conv as shifted multiply-adds (`reference.causal_conv`) against the depthwise `F.conv1d` it replaced.

They run here on the CPU, where each bf16 partial product is computed in fp32 (exact products, fp32 sums) - the
same arithmetic the tensor cores do, in another summation order; tests/gpu/test_prompt_forms_gpu.py checks the
CUDA forms on the H200. (The fused hyper-connection kernels, now taken by prompt chunks too, are the decode path's
own kernels, checked in Triton's interpreter by test_fused_decode_triton.py.)"""

from __future__ import annotations

import pytest
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
    kv_b = torch.randn(heads, nope + v, rank, generator=g) * 0.2
    layer.w_k, layer.w_v = kv_b[:, :nope], kv_b[:, nope:]  # views of one absorbed kv_b, as the loader makes them
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
    weights = ops.split_bf16(layer.w_k), ops.split_bf16(layer.w_v.transpose(1, 2))
    got = layer._attend_gathered_split(q, (hi[tokens], lo[tokens]), counts, *weights)
    assert relative_error(got, want) < 5e-5


def test_bf16_latents_are_used_as_they_are() -> None:
    """Latents read from a bf16 cache hold bf16 values: the split path takes them as its hi part with no lo (one
    product fewer a use, half the gathered bytes) and stays as close to the fp32 einsums."""
    layer = dsa_heads()
    g = torch.Generator().manual_seed(5)
    t, length = 40, 56
    q = torch.randn(t, layer.local_heads, layer.nope, generator=g)
    latents = torch.randn(length, layer.rank_dim, generator=g).bfloat16().float()
    hi, lo = ops.split_bf16(latents, bf16_values=True)
    assert lo is None and torch.equal(hi.float(), latents)
    assert not ops.split_bf16(latents)[1].float().abs().max()  # the full split finds nothing left, as it should
    mask = torch.arange(length)[None, :] <= torch.arange(length - t, length)[:, None]
    want = layer._attend(q, latents, mask)
    assert relative_error(layer._attend_split(q, latents, mask, bf16_latents=True), want) < 5e-5
    tokens = torch.randint(0, length, (t, 24), generator=g)
    counts = torch.ones(t, 24, dtype=torch.bool)
    weights = ops.split_bf16(layer.w_k), ops.split_bf16(layer.w_v.transpose(1, 2))
    got = layer._attend_gathered_split(q, (hi[tokens], None), counts, *weights)
    assert relative_error(got, layer._attend_lanes(q, latents[tokens], counts)) < 5e-5


def test_dsa_selected_tokens_split_in_query_blocks(monkeypatch) -> None:
    """`_attend_selected` with the split path taken (as a CUDA prompt chunk takes it), its queries gathered in
    blocks of 7 with a ragged last one: the fp32 path's result to ~1e-5, whatever the blocking."""
    layer = dsa_heads()
    g = torch.Generator().manual_seed(4)
    t, length, n = 30, 64, 16
    q = torch.randn(t, layer.local_heads, layer.nope, generator=g)
    latents = torch.randn(length, layer.rank_dim, generator=g)
    tokens = torch.randint(0, length + 4, (t, n), generator=g)  # past the end: clamped, as padding is
    counts = (torch.rand(t, n, generator=g) < 0.7) & (tokens < length)
    counts[:, 0], tokens[:, 0] = True, 0
    want = layer._attend_selected(q, latents, tokens, counts)
    monkeypatch.setattr(SparseMLA, "GATHER_ELEMENTS", 7 * n * layer.rank_dim)
    monkeypatch.setattr(SparseMLA, "_on_tensor_cores", lambda self, q: True)
    got = layer._attend_selected(q, latents, tokens, counts)
    assert relative_error(got, want) < 5e-5
    bf16 = latents.bfloat16().float()
    want = layer._attend_selected(q, bf16, tokens, counts)  # split in full, against the lo-free form
    assert relative_error(layer._attend_selected(q, bf16, tokens, counts, bf16_latents=True), want) < 5e-5


def test_a_bf16_kept_kv_b_gives_its_fp32_copys_bits(monkeypatch) -> None:
    """On a GPU the loader keeps kv_b as the bf16 it reads (half the bytes a decode step reads): on the CPU every
    attention path gives what the same values held in fp32 give, bit for bit — the einsums, the lane products, the
    split products (the bf16 weight is its own head: the remainder's product, exactly zero, is not made)."""
    kept = dsa_heads()
    kv_b = torch.cat([kept.w_k, kept.w_v], 1).bfloat16()
    kept.w_k, kept.w_v = kv_b[:, : kept.nope], kv_b[:, kept.nope :]
    upcast = dsa_heads()
    upcast.w_k, upcast.w_v = kept.w_k.float(), kept.w_v.float()
    g = torch.Generator().manual_seed(6)
    t, length, n = 12, 40, 16
    q = torch.randn(t, kept.local_heads, kept.nope, generator=g)
    latents = torch.randn(length, kept.rank_dim, generator=g)
    mask = torch.arange(length)[None, :] <= torch.arange(length - t, length)[:, None]
    tokens = torch.randint(0, length, (t, n), generator=g)
    counts = torch.rand(t, n, generator=g) < 0.8
    counts[:, 0] = True
    assert kept._split(kept.w_k)[1] is None and upcast._split(upcast.w_k)[1] is not None
    assert torch.equal(kept._attend(q, latents, mask), upcast._attend(q, latents, mask))
    assert torch.equal(kept._attend_lanes(q, latents[tokens], counts), upcast._attend_lanes(q, latents[tokens], counts))
    assert torch.equal(kept._attend_split(q, latents, mask), upcast._attend_split(q, latents, mask))
    monkeypatch.setattr(SparseMLA, "_on_tensor_cores", lambda self, q: True)
    assert torch.equal(
        kept._attend_selected(q, latents, tokens, counts), upcast._attend_selected(q, latents, tokens, counts)
    )


def test_the_cpu_never_takes_the_split_path() -> None:
    """(The CUDA gate's row boundary: tests/gpu/test_prompt_forms_gpu.py.)"""
    layer = dsa_heads()
    assert not layer._on_tensor_cores(torch.zeros(ops.ROW_INVARIANT_ROWS + 1, layer.local_heads, layer.nope))


@pytest.mark.parametrize("tokens", [1, 2, 37])
def test_causal_conv_matches_the_depthwise_conv(tokens: int) -> None:
    """`causal_conv` (shifted multiply-adds, token-major) against the depthwise conv it replaced, written here with
    `F.conv1d` on the channel-major sequence: the outputs to fp32 rounding, the new window exactly, also for chunks
    shorter than the window."""
    g = torch.Generator().manual_seed(7)
    channels, kernel = 48, 4
    x = torch.randn(tokens, channels, generator=g)
    window = torch.randn(channels, kernel - 1, generator=g)
    weight = torch.randn(channels, kernel, generator=g)
    seq = torch.cat([window, x.t()], dim=1)  # [C, K-1+T]
    conv = torch.nn.functional.conv1d(seq[None], weight[:, None], groups=channels)[0].t()
    want, want_window = torch.nn.functional.silu(conv), seq[:, -(kernel - 1) :]
    got, got_window = ops.causal_conv(x, window, weight)
    assert got.shape == want.shape and torch.equal(got_window, want_window)
    assert relative_error(got, want) < 1e-6


@pytest.mark.parametrize("index_topk", [8, 512], ids=["selected-tokens", "dense-regime"])
def test_split_attention_through_the_model_prefill(tmp_path, monkeypatch, index_topk: int) -> None:
    """The model's own prompt path with DSA's split attention taken (its CUDA gate opened on the CPU): a 300-token
    chunk (past 64 rows, so the split attention applies) gives the greedy tokens of the fp32 products and last logits
    within 1e-4. index_topk 8 puts the chunk in the selected-token regime, 512 in the dense one."""
    from reference import make_reference
    from test_parity import ours_greedy

    from engine.models.glm5_next.model import Glm5NextForCausalLM

    make_reference(tmp_path, "kda3_dsa1", seed=5, index_topk=index_topk)
    model = Glm5NextForCausalLM.load(tmp_path)
    ids = torch.randint(1, 97, (300,), generator=torch.Generator().manual_seed(8)).tolist()
    tokens, logits = ours_greedy(model, ids, 4)

    taken: dict[str, int] = {"dense": 0, "selected": 0}

    def counted(name: str, fn):
        def run(*args):
            taken[name] += 1
            return fn(*args)

        return run

    monkeypatch.setattr(SparseMLA, "_on_tensor_cores", lambda self, q: q.shape[0] > ops.ROW_INVARIANT_ROWS)
    monkeypatch.setattr(SparseMLA, "_attend_split", counted("dense", SparseMLA._attend_split))
    monkeypatch.setattr(SparseMLA, "_attend_gathered_split", counted("selected", SparseMLA._attend_gathered_split))
    got_tokens, got_logits = ours_greedy(model, ids, 4)
    # one DSA layer, one 300-row chunk, one gather block; the four decode rows stay on the fp32 products
    assert taken == ({"dense": 0, "selected": 1} if index_topk == 8 else {"dense": 1, "selected": 0})
    assert got_tokens == tokens
    assert 0 < relative_error(got_logits[0], logits[0]) < 1e-4  # > 0: the split products changed the arithmetic
