"""A prompt chunk's DSA at a long span reads only what it uses and holds a bounded amount of it at once
(engine/models/glm5_next/dsa.py `_stream`, `_select`, `_select_tokens`; engine/ops/reference.py `PoolLatents`):
- the indexer reads the pool keys (each pool's last row's key columns), not every row of the span;
- the attention's latents are read where the pool holds them, a block of queries' chosen tokens at a time (the CPU
  and the gathered tensor-core form), or split for the tensor cores a block of rows at a time (a bf16 pool's as
  stored), never as an fp32 copy of the whole span; the same values, so the same bits;
- the pool scores are made a block of queries at a time (`SELECT_SCORES`), so a chunk's [T, P] scores are never
  whole; each query's choice is its own, so the logits do not change with the block.
bench/long_prompt_bench.py measures the time and the memory a chunk takes beyond the cache."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference
from test_parity import prompt
from test_pool_keys import KVS

from engine import ops
from engine.cache import KVPool
from engine.models.glm5_next.dsa import SparseMLA
from engine.models.glm5_next.model import Glm5NextForCausalLM


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("dsa_heavy")
    make_reference(path, "dsa_heavy", seed=3)
    return Glm5NextForCausalLM.load(path)


@pytest.mark.parametrize("kv", KVS)
def test_pool_latents_give_the_values_of_a_whole_read(kv, monkeypatch):
    gen = torch.Generator().manual_seed(5)
    pool = KVPool(2, 300, 48, kv)
    slots = torch.randperm(300, generator=gen)[:250]
    pool.write(1, slots, torch.randn(250, 48, generator=gen) * 3)
    whole = pool.read(1, slots)[:, :32]
    latents = ops.PoolLatents(pool, 1, slice(0, 32), slots)
    assert latents.shape == (250, 32)
    picked = torch.randint(0, 250, (7, 11), generator=gen)
    assert torch.equal(latents.gather(picked), whole[picked])
    monkeypatch.setattr(ops.PoolLatents, "SPLIT_ROWS", 64)  # several blocks, a ragged last one
    hi, lo = latents.split()
    want_hi, want_lo = ops.split_bf16(whole, kv == "bf16")
    assert torch.equal(hi, want_hi)
    assert (lo is None) == (want_lo is None) == (kv == "bf16")
    if lo is not None:
        assert torch.equal(lo, want_lo)


@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("fp8_rows", ["split", "copy", "in_place", "copy_past_span"])
def test_pool_latents_by_row_index_the_values_of_a_whole_read(kv, fp8_rows, monkeypatch):
    """What the prompt kernel reads (`PoolLatents.by_row`): a bf16 pool's latent columns in place, its rows the
    tokens' slots (nothing gathered); where the kernel takes e4m3 (`fp8`), an fp8 pool's in place with the pool
    layer's row scales, or asked to `copy`, its stored values as a bf16 copy by position with their scales — for a
    span within COPY_ROWS (past it, in place); other pools' split latents by position. Token i of query t is row
    rows[t, i] of the parts either way, with the values a whole read holds at position tokens[t, i] (past the span:
    padding, never read by the kernel)."""
    gen = torch.Generator().manual_seed(8)
    pool = KVPool(1, 90, 40, kv)
    slots = torch.randperm(90, generator=gen)[:70]
    pool.write(0, slots, torch.randn(70, 40, generator=gen))
    tokens = torch.randint(0, 75, (6, 9), generator=gen)
    if fp8_rows == "copy_past_span":
        monkeypatch.setattr(ops.PoolLatents, "COPY_ROWS", 69)  # the span is 70
    fp8, copy = fp8_rows != "split", fp8_rows.startswith("copy")
    (hi, lo), rows, scales = ops.PoolLatents(pool, 0, slice(0, 24), slots).by_row(tokens, fp8=fp8, copy=copy)
    whole = pool.read(0, slots)[:, :24]
    want = whole[tokens.clamp(max=69)]
    rows = rows.clamp(max=hi.shape[0] - 1)  # the kernel never reads the padding's; torch indexing needs it in range
    assert (scales is not None) == (kv == "fp8" and fp8)
    if kv == "bf16" or (kv == "fp8" and fp8_rows in ("in_place", "copy_past_span")):  # a view of the pool's rows
        assert hi.data_ptr() == pool.rows[0].data_ptr() and hi.stride(0) == 40 and lo is None
    if scales is not None:  # the stored e4m3 values times their row's scale: KVPool.read's arithmetic
        assert hi.dtype == (torch.bfloat16 if fp8_rows == "copy" else torch.float8_e4m3fn) and lo is None
        assert torch.equal(hi[rows].float() * scales[rows][..., None], want)
        return
    want_hi, want_lo = ops.split_bf16(whole, kv == "bf16")
    assert torch.equal(hi[rows], want_hi[tokens.clamp(max=69)])
    assert (lo is None) == (kv == "bf16")
    if lo is not None:
        assert torch.equal(lo[rows], want_lo[tokens.clamp(max=69)])


def chunked_logits(model, kv: str, ids: list[int], chunk: int) -> list[torch.Tensor]:
    seq = model.new_sequence(model.make_pool(256, kv))
    return [model.prefill(seq, ids[i : i + chunk]) for i in range(0, len(ids), chunk)]


@torch.no_grad()
@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("tensor_cores", [False, True])
def test_the_scores_block_does_not_change_the_logits(model, kv, tensor_cores, monkeypatch):
    """A 150-token prompt past the dense regime in chunks of 50: the same logits with the pool scores made for the
    whole chunk at once and one query at a time; on the CPU's products, and with the tensor cores' split products
    taken (as a CUDA chunk takes them; on the CPU each bf16 partial product is exact)."""
    ids = prompt(seed=6, length=150)
    assert len(ids) // model.cfg.index_kpool > model.cfg.index_topk // model.cfg.index_kpool  # selection runs
    if tensor_cores:
        monkeypatch.setattr(SparseMLA, "_on_tensor_cores", lambda self, q: True)
    monkeypatch.setattr(SparseMLA, "SELECT_SCORES", 1 << 30)
    whole = chunked_logits(model, kv, ids, 50)
    monkeypatch.setattr(SparseMLA, "SELECT_SCORES", 1)  # one query a block
    for i, (a, b) in enumerate(zip(whole, chunked_logits(model, kv, ids, 50))):
        assert torch.equal(a, b), f"chunk {i}"
        assert torch.isfinite(a).all()


@torch.no_grad()
def test_a_chunk_reads_no_index_column_but_the_pool_keys(model):
    """Every index column of the complete pools' rows but the pool keys NaN before a next chunk (the unfinished
    pool's rows are read: the chunk completes it): its logits are unchanged. (This holds of the earlier form too,
    which read every row whole but used only the keys' values; the next test shows what is read.)"""
    ids, more = prompt(seed=6, length=150), prompt(seed=9, length=20)
    outs = []
    for poison in (False, True):
        seq = model.new_sequence(model.make_pool(256, "fp32"))
        model.prefill(seq, ids)
        if poison:
            for layer in (layer.attn for layer in model.layers if layer.is_dsa):
                rows = seq.pool.rows[layer.pool_layer]
                for position in range(len(ids) // layer.kpool * layer.kpool):  # the complete pools' rows
                    slot = int(seq.slots[position])
                    last = position % layer.kpool == layer.kpool - 1
                    rows[slot, layer.key_end if last else layer.rank_dim :] = float("nan")
        outs.append(model.prefill(seq, more))
    assert torch.isfinite(outs[1]).all()
    assert torch.equal(outs[0], outs[1])


@torch.no_grad()
@pytest.mark.parametrize("kv", KVS)
def test_a_chunk_past_the_dense_regime_never_reads_whole_rows(model, kv, monkeypatch):
    """What a chunk's DSA layers read of the pool (every `KVPool.read`, recorded): never a row whole; the latents
    only of the tokens a block of queries chose (at most its queries × the selection's width), the index columns
    only as the pool keys (one row a pool) and the unfinished pool's rows its completion reads. Before, every layer
    read every row of the span whole (this test failed)."""
    ids, more = prompt(seed=6, length=150), prompt(seed=9, length=20)
    seq = model.new_sequence(model.make_pool(256, kv))
    model.prefill(seq, ids)
    reads: list[tuple[slice, int]] = []
    served = KVPool.read

    def spy(pool, layer, slots, columns=slice(None)):
        reads.append((columns, slots.numel()))
        return served(pool, layer, slots, columns)

    monkeypatch.setattr(KVPool, "read", spy)
    model.prefill(seq, more)
    dsa = next(layer.attn for layer in model.layers if layer.is_dsa)
    kpool, span = dsa.kpool, len(ids) + len(more)
    width = dsa.pick * kpool + kpool  # tokens a query attends to past the dense regime
    latent, keys = slice(0, dsa.rank_dim), slice(dsa.rank_dim, dsa.key_end)
    assert reads and all(columns != slice(None) for columns, _ in reads), reads
    assert any(columns == latent for columns, _ in reads) and any(columns == keys for columns, _ in reads)
    for columns, rows in reads:
        if columns == latent:
            assert rows <= len(more) * width
        elif columns == keys:
            assert rows <= span // kpool
        else:  # the completion of pools the chunk's rows finish: their members' index columns
            assert columns == slice(dsa.rank_dim, None) and rows <= len(more) * kpool
