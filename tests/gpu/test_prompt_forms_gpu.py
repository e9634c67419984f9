"""The prompt path's CUDA forms on the GPU, each against the arithmetic it replaced (session 16, docs/BENCHMARKS.md):
DSA's prompt attention on the tensor cores (`ops.split_product`, `SparseMLA._on_tensor_cores`) against the fp32
products at the real model's head widths, dense regime and selected tokens; KDA's conv as shifted multiply-adds
against torch's depthwise conv in full fp32; the fused hyper-connection kernels over a whole prompt chunk against
the torch ops on the CPU. The attention's precision call by call in a whole model is a bench figure
(bench/gpu_engine.py `prompt_attention_precision`). Skipped without a GPU (never part of CI)."""

from __future__ import annotations

import pytest
import torch
from test_prompt_forms import dsa_heads, relative_error

from engine import ops
from engine.models.glm5_next.dsa import SparseMLA

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def dsa_layer() -> SparseMLA:
    """GLM-5.3-Flash's per-head widths (nope 192, v 256, latent 512), 16 local heads."""
    layer = dsa_heads(heads=16, nope=192, v=256, rank=512)
    kv_b = torch.cat([layer.w_k, layer.w_v], dim=1).cuda() * 0.3
    layer.w_k, layer.w_v = kv_b[:, :192], kv_b[:, 192:]
    return layer


def test_only_prompt_chunks_past_the_row_invariant_rows_take_the_split_path() -> None:
    layer = dsa_layer()
    rows = torch.zeros(ops.ROW_INVARIANT_ROWS + 1, 16, 192, device="cuda")
    assert layer._on_tensor_cores(rows)
    assert not layer._on_tensor_cores(rows[: ops.ROW_INVARIANT_ROWS])  # a verify window or a short last chunk
    assert not layer._on_tensor_cores(rows[:1])  # a decode token
    assert not layer._on_tensor_cores(rows.cpu())


def test_prompt_attention_on_tensor_cores_matches_fp32(monkeypatch) -> None:
    """Each call with the split products (the default for a prompt chunk on CUDA) and with the fp32 products on the
    CUDA cores (the gate closed)."""
    layer = dsa_layer()

    def on_fp32(call):
        with monkeypatch.context() as m:
            m.setattr(SparseMLA, "_on_tensor_cores", lambda self, q: False)
            return call()

    g = torch.Generator(device="cuda").manual_seed(0)
    t, length = 512, 1536
    q = torch.randn(t, 16, 192, device="cuda", generator=g)
    latents = torch.randn(length, 512, device="cuda", generator=g).bfloat16().float()  # as a bf16 pool returns them
    positions = torch.arange(length - t, length, device="cuda")
    mask = torch.arange(length, device="cuda")[None, :] <= positions[:, None]
    assert layer._on_tensor_cores(q)
    want = on_fp32(lambda: layer._attend(q, latents, mask))
    for bf16_latents in (False, True):
        got = layer._attend(q, latents, mask, bf16_latents)
        assert 0 < relative_error(got, want) < 5e-5  # > 0: the tensor-core path ran (bits differ from fp32's)

    n = 640
    tokens = torch.randint(0, length, (t, n), device="cuda", generator=g)
    counts = torch.rand(t, n, device="cuda", generator=g) < 0.9
    counts[:, 0] = True
    want = on_fp32(lambda: layer._attend_selected(q, latents, tokens, counts))
    for bf16_latents in (False, True):
        got = layer._attend_selected(q, latents, tokens, counts, bf16_latents)
        assert 0 < relative_error(got, want) < 5e-5


def _served_selection() -> tuple:
    """TP=2's share of the served DSA layer (32 heads, nope 256, latent 512) and a chunk of 160 queries at 4k: each
    query's 2,048 selected tokens in pools of 4 plus its unfinished pool, some not counted."""
    layer = dsa_heads(heads=32, nope=256, v=256, rank=512)
    kv_b = torch.cat([layer.w_k, layer.w_v], dim=1).cuda() * 0.3
    layer.w_k, layer.w_v = kv_b[:, :256], kv_b[:, 256:]
    g = torch.Generator(device="cuda").manual_seed(1)
    t, length, kpool = 160, 4096, 4
    positions = torch.arange(length - t, length, device="cuda")
    chosen = torch.rand(t, length // kpool, device="cuda", generator=g).topk(512, dim=-1).indices.sort(-1).values
    tokens = (chosen[:, :, None] * kpool + torch.arange(kpool, device="cuda")).flatten(1)
    tail = ((positions + 1) - (positions + 1) % kpool)[:, None] + torch.arange(kpool, device="cuda")
    tokens = torch.cat([tokens, tail], 1)
    counts = (tokens <= positions[:, None]) & (torch.rand(tokens.shape, device="cuda", generator=g) < 0.95)
    q = torch.randn(t, 32, 256, device="cuda", generator=g)
    latents = torch.randn(length, 512, device="cuda", generator=g)
    return layer, q, latents, tokens, counts


def _launches_of(gpu: str, monkeypatch) -> None:
    """`selected_attention` (and the fp8 copy's choice) under the launches PROMPT_LAUNCHES holds for a kind of GPU:
    "sm90" (Hopper's) or "other" (the rest: a GB10's), a lo part's its "_lo" launch."""
    from engine.ops import triton_dsa

    chosen = lambda capability, lo=False: triton_dsa.PROMPT_LAUNCHES[gpu + ("_lo" if lo else "")]
    monkeypatch.setattr(triton_dsa, "prompt_launch", chosen)


@pytest.mark.parametrize("gpu", ["sm90", "other"])
def test_the_selected_token_kernel_at_the_served_widths(gpu, monkeypatch) -> None:
    """A prompt chunk's attention over selected tokens runs as one kernel (engine/ops/triton_dsa.py
    `selected_attention`) at TP=2's share of the served layer (32 heads, nope 256, latent 512, 2,048 tokens in pools
    of 4 plus the unfinished pool, some not counted), and agrees with the fp32 products and the gathered split
    products it replaced, for latents from a bf16 cache and with a lo part — under the launches PROMPT_LAUNCHES
    holds for Hopper and for the other GPUs (a GB10's: the heads as the products' tall side on mma.sync's tiles)."""
    from engine.ops import triton_dsa

    _launches_of(gpu, monkeypatch)
    layer, q, latents, tokens, counts = _served_selection()
    t = q.shape[0]
    launched = []
    kernel = triton_dsa.selected_attention
    monkeypatch.setattr(triton_dsa, "selected_attention", lambda *a: launched.append(1) or kernel(*a))
    for values, bf16 in ((latents.bfloat16().float(), True), (latents, False)):
        with monkeypatch.context() as m:
            m.setattr(SparseMLA, "_on_tensor_cores", lambda self, q: False)
            want = layer._attend_selected(q, values, tokens, counts)
        with monkeypatch.context() as m:
            m.setattr(ops, "selected_attention_applies", lambda *a: False)
            gathered = layer._attend_selected(q, values, tokens, counts, bf16)
        got = layer._attend_selected(q, values, tokens, counts, bf16)
        assert 0 < relative_error(got, want) < 5e-5, (gpu, bf16)
        assert relative_error(got, gathered) < 5e-5
        # q_abs · scaling split in one launch and the context written split: the bits of the torch splits around a
        # kernel writing fp32 (the form before session 35)
        q_abs = ops.split_product(q.transpose(0, 1), layer._split(layer.w_k)) * layer.scaling
        ctx = kernel(ops.split_bf16(q_abs), ops.split_bf16(values, bf16), tokens, counts)
        before = ops.split_product(ctx, layer._split(layer.w_v.transpose(1, 2))).transpose(0, 1).reshape(t, -1)
        assert torch.equal(got, before)
    assert len(launched) == 2


@pytest.mark.parametrize("gpu", ["sm90", "other"])
@pytest.mark.parametrize("kv", ["bf16", "fp8", "fp32"])
def test_the_selected_token_kernel_reads_the_pools_latents_in_place(kv, gpu, monkeypatch) -> None:
    """A prompt chunk's latents left in the cache pool (`ops.PoolLatents`) at TP=2's share of the served layer, slots
    scattered as a pool hands them out: a bf16 pool's read by slot in place and an fp32 pool's split a block of rows
    at a time give the kernel's output for the same latents read whole, bit for bit; an fp8 pool's (e4m3 values,
    each row's scale on its scores and weights) agree with the fp32 products over value × scale — as a bf16 copy of
    the stored values under the H200's launch (a span within COPY_ROWS), read in place under the other GPUs' (a
    GB10's) — and read in place past COPY_ROWS give the same bits. Under Hopper's launches and the others'."""
    from engine.cache import KVPool

    _launches_of(gpu, monkeypatch)

    layer = dsa_heads(heads=32, nope=256, v=256, rank=512)
    kv_b = torch.cat([layer.w_k, layer.w_v], dim=1).cuda() * 0.3
    layer.w_k, layer.w_v = kv_b[:, :256], kv_b[:, 256:]
    g = torch.Generator(device="cuda").manual_seed(2)
    t, length, n = 160, 4096, 2052
    pool = KVPool(2, length + 100, 768, kv, "cuda")
    slots = torch.randperm(length + 100, device="cuda", generator=g)[:length]
    pool.write(1, slots, torch.randn(length, 768, device="cuda", generator=g))
    tokens = torch.randint(0, length, (t, n), device="cuda", generator=g)
    counts = torch.rand(t, n, device="cuda", generator=g) < 0.95
    counts[:, 0] = True
    tokens[~counts] = length + 7  # past the span: not counted, never read
    q = torch.randn(t, 32, 256, device="cuda", generator=g)
    from engine.ops import triton_dsa

    latents = ops.PoolLatents(pool, 1, slice(0, 512), slots)
    whole = pool.read(1, slots)[:, :512]
    launched = []
    kernel = triton_dsa.selected_attention
    monkeypatch.setattr(triton_dsa, "selected_attention", lambda *a: launched.append(a[1][0].data_ptr()) or kernel(*a))
    got = layer._attend_selected(q, latents, tokens, counts)
    in_place = kv == "bf16" or (kv == "fp8" and not triton_dsa.PROMPT_LAUNCHES[gpu]["fp8_copy"])
    assert (launched == [pool.rows[1].data_ptr()]) == in_place  # bf16 rows read in place, and e4m3 without a copy
    if kv != "fp8":
        assert torch.equal(got, layer._attend_selected(q, whole, tokens, counts, kv == "bf16"))
        return
    with monkeypatch.context() as m:
        m.setattr(SparseMLA, "_on_tensor_cores", lambda self, q: False)
        want = layer._attend_selected(q, whole, tokens.clamp(max=length - 1), counts)
    assert 0 < relative_error(got, want) < 5e-5
    monkeypatch.setattr(ops.PoolLatents, "COPY_ROWS", length - 1)  # past it: e4m3 rows read in place (an H200)
    assert torch.equal(layer._attend_selected(q, latents, tokens, counts), got)
    assert launched[-1] == pool.rows[1].data_ptr()


def test_causal_conv_matches_cudnn_in_fp32(monkeypatch) -> None:
    """A 2,048-token chunk at a KDA layer's conv width (3 × 32 heads × 128 = 12,288 channels, kernel 4) through the
    prompt conv's kernel (engine/ops/triton_kda.py `causal_conv`) against torch's depthwise conv, cuDNN's TF32 off so
    that the oracle is full fp32 whichever kernel it takes."""
    from engine.ops import triton_kda

    launched = []
    fused = triton_kda.causal_conv
    monkeypatch.setattr(triton_kda, "causal_conv", lambda *a: launched.append(1) or fused(*a))
    g = torch.Generator(device="cuda").manual_seed(1)
    channels, kernel, tokens = 12288, 4, 2048
    x = torch.randn(tokens, channels, device="cuda", generator=g)
    window = torch.randn(channels, kernel - 1, device="cuda", generator=g)
    weight = torch.randn(channels, kernel, device="cuda", generator=g)
    seq = torch.cat([window, x.t()], dim=1)
    had = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        conv = torch.nn.functional.conv1d(seq[None], weight[:, None], groups=channels)[0].t()
    finally:
        torch.backends.cudnn.allow_tf32 = had
    got, window_after = ops.causal_conv(x, window, weight)
    assert torch.equal(window_after, seq[:, -(kernel - 1) :])
    assert relative_error(got, torch.nn.functional.silu(conv)) < 1e-6
    assert launched


def test_the_conv_with_the_qk_norms_at_the_served_width() -> None:
    """A KDA prompt chunk's q, k, v in one launch (engine/ops/triton_kda.py `conv_qkv`: conv + SiLU, q's and k's 128-wide
    heads L2-normalised, q scaled, three contiguous outputs) at the served width (3 × 32 heads × 128, 2,048 tokens,
    rows of a strided view) against the torch form on the CPU (conv, split, reference.l2norm)."""
    g = torch.Generator().manual_seed(3)
    tokens, heads, dim, kernel = 2048, 32, 128, 4
    channels = 3 * heads * dim
    wide = torch.randn(tokens, channels + 64, generator=g) * 3
    window = torch.randn(channels, kernel - 1, generator=g)
    weight = torch.randn(channels, kernel, generator=g)
    x = wide[:, 32 : 32 + channels]
    want = ops.conv_qkv(x, window, weight, dim)
    got = ops.conv_qkv(x.cuda(), window.cuda(), weight.cuda(), dim)
    for a, b in zip(got[:3], want[:3]):
        assert a.is_contiguous() and a.shape == (tokens, heads, dim)
        assert relative_error(a.cpu(), b) < 1e-6
    assert torch.equal(got[3].cpu(), want[3])


def test_the_gated_norm_at_the_served_width() -> None:
    """A KDA prompt chunk's output before o_proj in one launch (`ops.gated_norm(..., prompt=True)` on CUDA: each
    128-wide head RMS-normalised, · weight, · sigmoid(gate), written as bf16 for a bf16 o_proj and fp32 for an fp32
    one) at the served width (2,048 tokens, 32 heads, the gate as rows of a strided view) against the torch form on the CPU."""
    g = torch.Generator().manual_seed(4)
    tokens, heads, dim = 2048, 32, 128
    core = torch.randn(tokens, heads, dim, generator=g) * 3
    gate = (torch.randn(tokens, 2 * heads * dim, generator=g) * 2)[:, heads * dim :]
    weight = torch.rand(dim, generator=g) + 0.5
    want = ops.gated_norm(core, gate, weight, 1e-6, torch.empty(0))
    for dtype in (torch.bfloat16, torch.float32):
        out = torch.empty(0, dtype=dtype, device="cuda")
        got = ops.gated_norm(core.cuda(), gate.cuda(), weight.cuda(), 1e-6, out, prompt=True)
        assert got.dtype == dtype and got.shape == (tokens, heads * dim)
        assert relative_error(got.float().cpu(), want) < (2**-8 if dtype == torch.bfloat16 else 1e-6)
    step = ops.gated_norm(core.cuda(), gate.cuda(), weight.cuda(), 1e-6, torch.empty(0, device="cuda").bfloat16())
    assert step.dtype == torch.float32  # not a prompt chunk (a decode step, however wide): the torch form


def test_fused_hyper_connection_over_a_prompt_chunk() -> None:
    """`ops.hc_around` on a 2,048-token chunk with 4 streams of 4,096 (the fused kernels on CUDA) against the same
    on the CPU (torch ops): fp32 sums in another order."""
    g = torch.Generator().manual_seed(2)
    tokens, n, hidden = 2048, 4, 4096
    streams = torch.randn(tokens, n, hidden, generator=g)
    fn = torch.randn(n * n + 2 * n, n * hidden, generator=g) * 0.02
    base = torch.randn(n * n + 2 * n, generator=g) * 0.5
    scale = torch.rand(3, generator=g) + 0.5
    norm = torch.rand(hidden, generator=g) + 0.5
    mix = torch.randn(hidden, hidden, generator=g) / hidden**0.5

    def around(dev: str) -> torch.Tensor:
        w = mix.to(dev)
        args = (fn.to(dev), base.to(dev), scale.to(dev), norm.to(dev), 1e-6, 1e-6, 1e-5, 20)
        return ops.hc_around(streams.to(dev), lambda x: torch.tanh(x @ w), *args)[0]

    got, want = around("cuda").cpu(), around("cpu")
    assert relative_error(got, want) < 2e-5


def test_fused_hyper_connection_past_int32_offsets() -> None:
    """A chunk whose streams hold more than 2^31 values (131,073 tokens of 4 × 4,096): the kernels' offsets are
    64-bit, so the first and last tokens get what they get in a chunk of their own (within fp32 rounding: a prompt
    chunk's dot products are a cuBLAS product, whose algorithm may change with the row count; a wrapped offset
    would read other tokens' streams)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    tokens, n, hidden = 2**31 // (4 * 4096) + 1, 4, 4096
    streams = torch.randn(tokens, n, hidden, device="cuda", generator=g)
    fn = torch.randn(n * n + 2 * n, n * hidden, device="cuda", generator=g) * 0.02
    base = torch.randn(n * n + 2 * n, device="cuda", generator=g) * 0.5
    scale = torch.rand(3, device="cuda", generator=g) + 0.5
    norm = torch.rand(hidden, device="cuda", generator=g) + 0.5
    args = (fn, base, scale, norm, 1e-6, 1e-6, 1e-5, 20)
    tail = ops.hc_around(streams[-80:], torch.tanh, *args)[0]
    whole = ops.hc_around(streams, torch.tanh, *args)[0]
    assert relative_error(whole[-80:], tail) < 1e-5
    assert relative_error(whole[:80], ops.hc_around(streams[:80], torch.tanh, *args)[0]) < 1e-5
