"""engine/ops/triton_rows.py on the GPU at GLM-5.3-Flash's shapes (TP=2 shard): the MoE router [288, 4,096] and
DSA's absorbed kv_b heads (16 local heads, nope 192, v 256, latent 512), against the float64 product, a row's bits
alone and among 64 rows, and the dispatch: an fp32 `ops.linear` of a step's rows takes the kernel drafts or not,
`ops.head_products` in a step that may verify drafts. Skipped without a GPU (never part of CI)."""

from __future__ import annotations

import pytest
import torch

from engine import ops
from engine.ops import reference, triton_dsa, triton_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator(device="cuda").manual_seed(5)
    kv_b = torch.randn(16, 192 + 256, 512, device="cuda", generator=g) * 0.05
    return {
        "router": (torch.randn(64, 1, 4096, device="cuda", generator=g), torch.randn(1, 288, 4096, device="cuda")),
        "w_k": (torch.randn(64, 16, 192, device="cuda", generator=g), kv_b[:, :192].transpose(1, 2)),
        "w_v": (torch.randn(64, 16, 512, device="cuda", generator=g), kv_b[:, 192:]),
    }


@pytest.mark.parametrize("name", ["router", "w_k", "w_v"])
def test_rows_product_is_exact_to_fp32_and_row_invariant(name):
    x, w = _cases()[name]
    got = triton_rows.rows_product(x, w)
    exact = torch.einsum("npk,pok->npo", x.double(), w.double())
    assert float((got.double() - exact).abs().max() / exact.abs().max()) < 1e-6
    for n, start in ((1, 0), (1, 63), (4, 9), (16, 30), (5, 59)):
        assert torch.equal(triton_rows.rows_product(x[start : start + n], w), got[start : start + n]), (n, start)


def test_dispatch_of_fp32_rows_and_head_products(monkeypatch):
    """An fp32 weight's few rows (the routers) take the kernel drafts or not (cuBLAS's fp32 product at 2–16 rows
    took 1.7–4× its time); the head products in a step that may verify drafts."""
    x, w = _cases()["router"]
    rows, weight = x[:3, 0], w[0]
    for kinds in (set(), set(reference.ROW_INVARIANT_KINDS)):  # drafts off, then a step that may verify
        monkeypatch.setattr(reference, "CUDA_ROW_BLOCKS", kinds)
        assert torch.equal(ops.linear(rows, weight), triton_rows.rows_product(x[:3], w)[:, 0])
    q, w_k = _cases()["w_k"]
    kernel = ops.head_products(q[:2], w_k, lambda r: pytest.fail("the torch form ran"))
    assert torch.equal(kernel, triton_rows.rows_product(q[:2], w_k))


def test_a_padded_bf16_product_casts_in_its_padding_copy(monkeypatch):
    """In a step that may verify drafts, a bf16 weight's product pads the rows to 16 and casts them in the same copy:
    the bits of the zero-padded fp32 rows cast afterwards (the form before), for each row alone or among others."""
    g = torch.Generator(device="cuda").manual_seed(6)
    x = torch.randn(20, 4096, device="cuda", generator=g)
    w = (torch.randn(3072, 4096, device="cuda", generator=g) * 0.02).bfloat16()
    monkeypatch.setattr(reference, "CUDA_ROW_BLOCKS", set(reference.ROW_INVARIANT_KINDS))
    poison = torch.full((16, 4096), float("nan"), dtype=torch.bfloat16, device="cuda")
    del poison  # the padded block most likely reuses its memory: NaN padding rows must not reach a real row
    got = ops.linear(x[:5], w)
    before = torch.cat([x[:5], x.new_zeros(11, 4096)]).bfloat16()
    assert torch.equal(got, torch.mm(before, w.t(), out_dtype=torch.float32)[:5]) and not got.isnan().any()
    assert torch.equal(ops.linear(x[3:4], w), got[3:4])
    pairs = torch.stack([w[:1024], w[1024:2048]])  # two weights, as KDA's low-rank gates
    both = ops.linear_pairs(torch.stack([x[:5, :1024], x[5:10, :1024]]), pairs[:, :, :1024])
    assert torch.equal(
        both[1][2:3], ops.linear_pairs(torch.stack([x[:1, :1024], x[7:8, :1024]]), pairs[:, :, :1024])[1]
    )


@pytest.mark.parametrize("heads", [32, 64])
def test_lane_attention_is_exact_to_fp32_and_row_invariant(heads):
    """engine/ops/triton_dsa.py at the served sizes (2,052 selected tokens, latent 512; 32 local heads at TP=2, 64 at
    TP=1) against the float64 softmax attention, rows with few and with most tokens counted, and a row's bits alone
    and among 16 rows (a verify window of four in four lanes)."""
    from engine.ops import triton_dsa

    g = torch.Generator(device="cuda").manual_seed(9)
    q_abs = torch.randn(16, heads, 512, device="cuda", generator=g) * 0.05
    latents = torch.randn(16, 2052, 512, device="cuda", generator=g)
    counts = torch.rand(16, 2052, device="cuda", generator=g) < torch.linspace(0.001, 0.9, 16, device="cuda")[:, None]
    counts[:, -1] = True  # each query counts its own token
    got = triton_dsa.lane_attention(q_abs, latents, counts, 0.0625)
    scores = torch.einsum("bhr,bnr->bhn", q_abs.double(), latents.double()) * 0.0625
    probs = torch.softmax(scores.masked_fill(~counts[:, None, :], float("-inf")), dim=-1)
    exact = torch.einsum("bhn,bnr->bhr", probs, latents.double())
    assert float((got.double() - exact).abs().max() / exact.abs().max()) < 1e-5
    for n, start in ((1, 0), (1, 15), (4, 3), (5, 11)):
        alone = triton_dsa.lane_attention(
            q_abs[start : start + n], latents[start : start + n], counts[start : start + n], 0.0625
        )
        assert torch.equal(alone, got[start : start + n]), (n, start)


@pytest.mark.parametrize("kv", ["fp32", "bf16", "fp8"])
def test_lane_attention_reads_the_pools_latents_in_place(kv):
    """A step's latents left in the cache pool (`ops.PoolColumns`, slots [16, 2,052] scattered over a pool layer whose
    rows hold more than the latent: strided) give the bits of the same values gathered as KVPool.read gives them,
    for every row type, a row alone too; and `ops.lane_attention` takes the kernel for them."""
    from engine.cache import KVPool
    from engine.ops import triton_dsa

    g = torch.Generator(device="cuda").manual_seed(10)
    pool = KVPool(1, 8192, 768, kv, "cuda")
    pool.write(0, torch.arange(8193, device="cuda"), torch.randn(8193, 768, device="cuda", generator=g))
    slots = torch.randint(0, 8193, (16, 2052), device="cuda", generator=g)
    counts = torch.rand(16, 2052, device="cuda", generator=g) < 0.8
    counts[:, -1] = True
    q_abs = torch.randn(16, 32, 512, device="cuda", generator=g) * 0.05
    held = reference.PoolColumns(pool, 0, slice(0, 512), slots)
    got = triton_dsa.lane_attention(q_abs, held, counts, 0.0625)
    assert torch.equal(got, triton_dsa.lane_attention(q_abs, held.read(), counts, 0.0625))
    alone = reference.PoolColumns(pool, 0, slice(0, 512), slots[5:6])
    assert torch.equal(triton_dsa.lane_attention(q_abs[5:6], alone, counts[5:6], 0.0625), got[5:6])
    assert torch.equal(ops.lane_attention(q_abs, held, counts, 0.0625, lambda *a: pytest.fail("torch form")), got)


@pytest.mark.parametrize("width", [512, 1536, 4096])
def test_rms_norm_rows_is_exact_to_fp32_and_row_invariant(width):
    """engine/ops/triton_rows.py `rms_norm_rows` at the served widths (DSA's kv_a latent, a strided view; q_a; the
    hidden size: one warp and four) against the float64 norm, a row's bits alone and among 64, and `ops.rms_norm`
    taking it for a step's rows."""
    g = torch.Generator(device="cuda").manual_seed(11)
    x = (torch.randn(64, width + 64, device="cuda", generator=g) * 3)[:, :width]
    weight = torch.rand(width, device="cuda", generator=g) + 0.5
    got = triton_rows.rms_norm_rows(x, weight, 1e-6)
    xd = x.double()
    exact = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    assert float((got.double() - exact).abs().max() / exact.abs().max()) < 1e-6
    for n, start in ((1, 0), (1, 63), (4, 9), (16, 30)):
        assert torch.equal(triton_rows.rms_norm_rows(x[start : start + n], weight, 1e-6), got[start : start + n])
    assert torch.equal(ops.rms_norm(x, weight, 1e-6), got)


@pytest.mark.parametrize("tokens", [4, 300])
def test_hyper_connection_kernels_at_the_served_width(tokens):
    """engine/ops/triton_mhc.py at GLM-5.3-Flash's width (4 streams of 4,096): a decode step's rows and a prompt
    chunk (the dot products as one fp32 matrix product, one `_hc_mix` program a token) against the torch path in
    float64, and a token's input to its sublayer with every other token changed."""
    from engine.ops import triton_mhc

    g = torch.Generator(device="cuda").manual_seed(8)
    n, hidden = 4, 4096
    fn = torch.randn(2 * n + n * n, n * hidden, device="cuda", generator=g) * 0.01
    base = torch.randn(2 * n + n * n, device="cuda", generator=g) * 0.5
    scale = torch.rand(3, device="cuda", generator=g)
    norm = torch.rand(hidden, device="cuda", generator=g) + 0.5
    streams = torch.randn(tokens, n, hidden, device="cuda", generator=g)
    args = (fn, base, scale, norm, 1e-6, 1e-6, 1e-6, 20)
    x, post, comb = triton_mhc.hc_pre(streams, *args)
    got, none = triton_mhc.hc_post(streams, torch.tanh(x), post, comb)
    exact, _ = ops.hc_around(streams.cpu().double(), torch.tanh, *(a.cpu().double() for a in args[:4]), *args[4:])
    assert float((got.cpu().double() - exact).abs().max() / exact.abs().max()) < 2e-5
    # chained (a step's form): the same new streams, and the next hyper-connection's sums give its unchained bits
    chained, ahead = triton_mhc.hc_post(streams, torch.tanh(x), post, comb, fn)
    assert none is None and torch.equal(chained, got) and (ahead is None) == (tokens > triton_mhc.DECODE_TOKENS)
    if ahead is not None:
        pairs = zip(triton_mhc.hc_pre(got, *args, partials=ahead), triton_mhc.hc_pre(got, *args))
        assert all(torch.equal(a, b) for a, b in pairs)
    others = torch.randn(tokens, n, hidden, device="cuda", generator=g)
    others[-1] = streams[-1]
    assert torch.equal(triton_mhc.hc_pre(others, *args)[0][-1], x[-1])


@pytest.mark.parametrize("keys_kind, contexts", [("fp32", 8192), ("fp32", 32768), ("bf16", 32768), ("fp8", 32768)])
def test_indexer_scores_at_the_served_shapes(keys_kind, contexts):
    """engine/ops/triton_dsa.py `index_scores` (DSA's indexer: 32 heads of 128, pools of 16) for a 2,048-query prompt
    chunk ending at `contexts`, its keys an fp32 tensor (tf32x3 products) or left in a bf16 or fp8 cache pool (the
    split bf16 form: q in three bf16 parts — made for the launch — against the stored values, an fp8 row's scale on
    the product; fp8 keys as a bf16 copy): against the float64 sums over the values the keys hold, the pools a query
    cannot see at fp32's lowest, and each query's bits the same with the chunk's shared keys, with its own keys (a
    decode step's form: q split in the kernel, e4m3 converted there) and alone — so a query chooses the same pools
    in a prompt chunk and in a decode step."""
    from engine.cache import KVPool
    from engine.ops import triton_dsa

    g = torch.Generator(device="cuda").manual_seed(8)
    t, pools = 2048, contexts // 16
    rows = torch.tensor([0, 1, 777, t - 1], device="cuda")
    if keys_kind == "fp32":
        keys = torch.randn(1, pools, 128, device="cuda", generator=g) * 0.3
        own, held = keys.expand(4, -1, -1), keys[0]
    else:
        pool = KVPool(1, pools * 2, 768, keys_kind, "cuda")
        pool.write(0, torch.arange(pools * 2, device="cuda"), torch.randn(pools * 2, 768, device="cuda", generator=g))
        ends = torch.randperm(pools * 2, device="cuda", generator=g)[:pools][None]
        keys = reference.PoolKeys(pool, 0, slice(512, 640), ends)
        own, held = reference.PoolKeys(pool, 0, slice(512, 640), ends.expand(4, -1)), keys.read()[0]
    q = torch.randn(t, 32, 128, device="cuda", generator=g)
    head_w = torch.randn(t, 32, device="cuda", generator=g) * 0.2
    positions = torch.arange(contexts - t, contexts, device="cuda")
    got = ops.index_scores(q, keys, head_w, positions, 16, 128**-0.5)
    scores = torch.relu(torch.einsum("thd,pd->thp", q.double(), held.double()) * 128**-0.5)
    want = torch.einsum("th,thp->tp", head_w.double(), scores)
    hidden = (torch.arange(pools, device="cuda") * 16 + 15)[None, :] > positions[:, None]
    assert hidden.any() and not hidden.all()
    assert torch.equal(got == torch.finfo(torch.float32).min, hidden)
    seen = want.masked_fill(hidden, 0)
    assert float((got.double().masked_fill(hidden, 0) - seen).abs().max() / seen.abs().max()) < 1e-6
    assert torch.equal(triton_dsa.index_scores(q[rows], own, head_w[rows], positions[rows], 16, 128**-0.5), got[rows])
    for i in rows.tolist():
        alone = ops.index_scores(q[i : i + 1], keys, head_w[i : i + 1], positions[i : i + 1], 16, 128**-0.5)
        assert torch.equal(alone[0], got[i]), i


def test_triton_converts_every_e4m3_value_to_bf16_as_torch_does():
    """Every e4m3 bit pattern but NaN's converted to bf16 inside a Triton kernel — directly, widened to fp32 first,
    and widened then passed through `triton_dsa._bf16_boundary` (a decode step's fp8 index keys since session 34) —
    against torch's conversion: exact values, so the same bits. Session 32 found a decode step's fp8 indexer scores
    with other bits than a prompt chunk's; the first two conversions passing here (session 33) ruled the conversion
    out, and session 34 found the cause in the operands' layout (kWidth; see `_bf16_boundary`)."""
    import triton
    import triton.language as tl

    @triton.jit
    def convert(x_ptr, direct_ptr, widened_ptr, kept_ptr):
        at = tl.arange(0, 256)
        x = tl.load(x_ptr + at)
        tl.store(direct_ptr + at, x.to(tl.bfloat16))
        tl.store(widened_ptr + at, x.to(tl.float32).to(tl.bfloat16))
        tl.store(kept_ptr + at, triton_dsa._bf16_boundary(x.to(tl.float32).to(tl.bfloat16)))

    bits = torch.arange(256, dtype=torch.int32, device="cuda").to(torch.uint8)
    values = bits.view(torch.float8_e4m3fn)
    direct, widened, kept = (torch.empty(256, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    convert[(1,)](values, direct, widened, kept)
    finite = ~values.float().isnan()
    want = values.to(torch.bfloat16)
    for got in (widened, direct, kept):
        assert torch.equal(got[finite].view(torch.int16), want[finite].view(torch.int16))
