"""DSA's pool keys, made once when a pool's last token is written and kept in that token's row
(engine/models/glm5_next/dsa.py `_store`): what the indexer reads and what it finds there, on tiny
random checkpoints on the CPU, for every cache row type."""

from __future__ import annotations

import pytest
import torch
from reference import make_reference
from test_parity import prompt

from engine.cache import KVPool, Sequence
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.runner.lanes import LaneDecoder

KVS = ["fp32", "bf16", "fp8"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("dsa_heavy")
    make_reference(path, "dsa_heavy", seed=2)
    return Glm5NextForCausalLM.load(path)


def indexers(model):
    return [layer.attn for layer in model.layers if layer.is_dsa and layer.attn.runs_indexer]


def poison_complete_pools(model, seq: Sequence, length: int) -> int:
    """NaN in every index column of the complete pools' rows below `length` except each pool's key (the key columns
    of its last row): what a step may no longer read. Returns the values poisoned."""
    poisoned = 0
    for attn in indexers(model):
        kpool, rows = attn.kpool, seq.pool.rows[attn.pool_layer]
        for position in range(length // kpool * kpool):
            slot = int(seq.slots[position])
            if position % kpool == kpool - 1:  # the pool's own row: its gate columns are dead too
                rows[slot, attn.key_end :] = float("nan")
                poisoned += attn.idx_dim
            else:
                rows[slot, attn.rank_dim :] = float("nan")
                poisoned += 2 * attn.idx_dim
    return poisoned


def decode_outputs(model, kv: str, poison: bool, graphs: bool = False) -> list[torch.Tensor]:
    """Logits of a 61-token prompt (past the dense regime), then decode steps through lanes (one token a step, a
    verify window of 4 whose rows complete pools inside the step) and the plain path, a next turn's prompt chunk and
    a step after it; with `poison`, every index column of the prompt's complete pools but their keys NaN first."""
    ids, tokens = prompt(seed=4, length=61), [5, 9, 14, 3, 22, 8, 31, 2, 17]
    more = prompt(seed=8, length=9)
    assert len(ids) // model.cfg.index_kpool > model.cfg.index_topk // model.cfg.index_kpool  # selection runs
    decoder = LaneDecoder(model, model.make_pool(128, kv), num_lanes=2, graphs=graphs, window=4)
    seq, plain = decoder.new_sequence(1), model.new_sequence(model.make_pool(128, kv))
    out = [model.prefill(seq, ids), model.prefill(plain, ids)]
    if poison:
        assert poison_complete_pools(model, seq, len(ids)) > 0
        assert poison_complete_pools(model, plain, len(ids)) > 0
    for token in tokens[:3]:  # one token a step
        out += [decoder.decode([seq], [token])[0], model.decode([plain], [token])[0]]
    logits = decoder.verify([seq], [tokens[3:7]])
    decoder.commit(seq, 4)
    for token in tokens[3:7]:
        out.append(model.decode([plain], [token])[0])
    out += [logits[0], decoder.decode([seq], [tokens[7]])[0], model.decode([plain], [tokens[7]])[0]]
    out += [model.prefill(seq, more), model.prefill(plain, more)]  # a next turn's prompt chunk
    return [*out, decoder.decode([seq], [tokens[8]])[0], model.decode([plain], [tokens[8]])[0]]


@torch.no_grad()
@pytest.mark.parametrize("kv", KVS)
def test_steps_read_only_the_pool_keys_of_complete_pools(model, kv):
    """Decode steps (plain, lanes, verify windows) and a further prompt chunk give the same logits with every index
    column of the prompt's complete pools but their keys made NaN: the pool keys are all they read of them (before
    the keys were stored, every step read and pooled each token's key and gate score: this test failed)."""
    clean, poisoned = decode_outputs(model, kv, False), decode_outputs(model, kv, True)
    for i, (a, b) in enumerate(zip(clean, poisoned)):
        assert torch.equal(a, b), f"output {i}"
        assert torch.isfinite(a).all()


@torch.no_grad()
@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_a_rejected_row_that_completed_a_pool_leaves_no_trace(model, kv):
    """A verify window whose rejected rows complete a pool (its key written into a row past the lane's length), then
    other tokens at those positions: every logit and pool row as one token a step gives them (spans padded as under
    graphs, so the members' clamp runs too)."""
    ids = prompt(seed=5, length=61)  # the window's rows at 61..64: 63 completes a pool
    tokens = [7, 19, 4, 25, 11]

    def lanes(window: int):
        # 66 slots: the padded span is the whole table, and the row at 64 reaches past it for its pool (clamped)
        decoder = LaneDecoder(model, model.make_pool(66, kv), num_lanes=2, graphs=False, window=window)
        decoder.min_span, decoder.pad_spans = 8, True
        seq = decoder.new_sequence(1)
        return decoder, seq, model.prefill(seq, ids)

    drafted, seq, first = lanes(4)
    got = [first, drafted.verify([seq], [[tokens[0], 40, 41, 42]])[0, 0]]  # drafts 40, 41, 42 rejected
    drafted.commit(seq, 1)
    window = drafted.verify([seq], [tokens[1:4]])[0]
    drafted.commit(seq, 3)
    got += [*window, drafted.decode([seq], [tokens[4]])[0]]
    serial, one, first = lanes(1)
    want = [first] + [serial.decode([one], [t])[0] for t in tokens]
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"logits {i}"
    for attn in indexers(model):
        rows = (d.pool.read(attn.pool_layer, s.slots[: s.length]) for d, s in ((drafted, seq), (serial, one)))
        assert torch.equal(*rows), f"pool layer {attn.pool_layer}"


def write_in_chunks(attn, kv: str, rows: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """`_store_at` on a fresh pool in chunks of these sizes; the pool's rows by position."""
    pool = KVPool(attn.pool_layer + 1, rows.shape[0] + 4, attn.row_width, kv)
    seq = Sequence(pool)
    start = 0
    for size in chunks:
        seq.grow(size)
        attn._store_at(seq, start, rows[start : start + size])
        start += size
    assert start == rows.shape[0]
    return pool.read(attn.pool_layer, seq.slots)


@torch.no_grad()
@pytest.mark.parametrize("kv", KVS)
def test_a_pools_key_is_the_same_bits_however_its_tokens_arrive(model, kv):
    """Rows written at once, in uneven chunks and a token at a time leave the same bits in the pool; each complete
    pool's last row holds the softmax(gate + ape)-weighted mean of its tokens' keys as the pool stored them (fp32:
    the rows themselves), the rest of its row and every other row as written."""
    attn = indexers(model)[0]
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(23, attn.row_width, generator=gen)
    whole = write_in_chunks(attn, kv, rows, [23])
    assert torch.equal(write_in_chunks(attn, kv, rows, [3, 1, 6, 2, 5, 6]), whole)
    assert torch.equal(write_in_chunks(attn, kv, rows, [1] * 23), whole)
    r, e, kpool = attn.rank_dim, attn.key_end, attn.kpool
    ends = list(range(kpool - 1, rows.shape[0], kpool))
    others = [p for p in range(rows.shape[0]) if p not in ends]

    def stored_alone(row: torch.Tensor) -> torch.Tensor:  # a row as the pool keeps it, at a place completing nothing
        return write_in_chunks(attn, kv, row[None], [1])[0]

    for p in others:
        assert torch.equal(whole[p], stored_alone(rows[p])), f"position {p}"
    for end in ends:
        members = torch.stack([*whole[end - kpool + 1 : end], stored_alone(rows[end])])
        key = attn._pool_keys(members[:, r:])
        assert torch.equal(whole[end], stored_alone(attn._with_key(rows[end : end + 1], key[None])[0])), f"pool {end}"
        if kv == "fp32":  # the definition, in torch's own softmax
            weights = torch.softmax(members[:, attn.idx_dim + r :] + attn.ape, dim=0)
            assert torch.allclose(whole[end, r:e], (weights * members[:, r:e]).sum(0), atol=1e-6)
            assert not torch.equal(whole[end, r:e], rows[end, r:e])
