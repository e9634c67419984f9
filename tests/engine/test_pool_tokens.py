"""DSA's selected tokens from each query's chosen pools (`ops.pool_tokens`): the torch form (engine/ops/reference.py)
against the rule as `_select_tokens` wrote it before it was an op — the chosen pools' tokens, padding pools that never
count, the unfinished pool's tail, the dense regime's cap on the tail, and the slots by a step's table —, and the
kernel a CUDA step runs in its place (engine/ops/triton_dsa.py `pool_tokens`, one launch) under Triton's
interpreter: the same integers, exactly. tests/gpu/test_pool_keys_gpu.py runs the kernel on CUDA, eagerly and in a
graph; the model-level tests (test_lane_decode.py, the GPU suite) run it inside the served step."""

from __future__ import annotations

import json

import torch
from interpreter import figures_of

from engine.ops import reference


def by_hand(chosen, positions, kpool, pools, n_pools, cap, table):
    """The rule as `SparseMLA._select_tokens` wrote it before `pool_tokens` (session 50's tree), then the lane
    step's slot gather: padding pools arange(n_pools, pick) after a choice of every pool."""
    dev, batch = positions.device, positions.shape[0]
    if chosen is None:
        chosen = torch.arange(n_pools, device=dev).expand(batch, -1)
    counts = chosen * kpool + kpool - 1 <= positions[:, None]
    if chosen.shape[1] < pools:
        extra = torch.arange(chosen.shape[1], pools, device=dev).expand(batch, -1)
        chosen = torch.cat([chosen, extra], dim=1)
        counts = torch.cat([counts, torch.zeros_like(extra, dtype=torch.bool)], dim=1)
    within = torch.arange(kpool, device=dev)
    tokens = (chosen[:, :, None] * kpool + within).flatten(1)
    counts = counts[:, :, None].expand(-1, -1, kpool).flatten(1)
    tail = ((positions + 1) - (positions + 1) % kpool)[:, None] + within
    tail_counts = tail <= positions[:, None]
    if cap is not None:
        tail_counts &= (((positions + 1) // kpool).clamp(max=n_pools) <= cap)[:, None]
    tokens, counts = torch.cat([tokens, tail], 1), torch.cat([counts, tail_counts], 1)
    if table is not None:
        tokens = table.expand(batch, -1).gather(1, tokens.clamp(max=table.shape[1] - 1))
    return tokens, counts


def cases(device: str) -> list[tuple[str, dict]]:
    """(name, pool_tokens' arguments): a sparse choice at a step's span (every query beyond the dense regime), a
    choice padded to `pools` (fewer pools than may be picked), every pool of a short span (the dense shortcut: no
    choice), the tail's cap on and off, a prompt chunk's choice without a table, a table shared by every query,
    queries whose tail is empty (the position a pool's last) and a span shorter than a pool."""
    gen = torch.Generator().manual_seed(11)
    out = []
    kpool, pick = 4, 16
    positions = torch.tensor([70, 127, 99, 64, 3])  # 17, 31, 24, 16 and 0 complete pools
    span = 128
    table = torch.randperm(4096, generator=gen)[: positions.shape[0] * span].view(-1, span)
    n_pools = span // kpool
    chosen = torch.stack([torch.randperm(n_pools, generator=gen)[:pick].sort().values for _ in positions])
    for cap in (None, pick):
        out.append((f"sparse, cap {cap}", dict(chosen=chosen, positions=positions, kpool=kpool, pools=pick,
                                                n_pools=n_pools, tail_cap=cap, table=table)))  # fmt: skip
    short = positions.clamp(max=39)
    few = torch.arange(10).expand(5, -1)  # a 40-token span: 10 pools, all chosen by scores, padded to 16
    out.append(("padded choice", dict(chosen=few, positions=short, kpool=kpool, pools=pick, n_pools=10,
                                      tail_cap=pick, table=table[:, :40])))  # fmt: skip
    for cap in (None, pick):
        out.append((f"every pool, cap {cap}", dict(chosen=None, positions=short, kpool=kpool, pools=pick,
                                                   n_pools=10, tail_cap=cap, table=table[:, :40])))  # fmt: skip
    out.append(("prompt chunk, no table", dict(chosen=chosen, positions=positions, kpool=kpool, pools=pick,
                                               n_pools=n_pools, tail_cap=pick, table=None)))  # fmt: skip
    out.append(("one table row", dict(chosen=chosen, positions=positions, kpool=kpool, pools=pick,
                                      n_pools=n_pools, tail_cap=None, table=table[:1])))  # fmt: skip
    out.append(("no pool yet", dict(chosen=None, positions=torch.tensor([0, 2]), kpool=kpool, pools=pick,
                                    n_pools=0, tail_cap=None, table=table[:2, :3])))  # fmt: skip
    moved = []
    for name, args in out:
        moved.append((name, {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}))
    return moved


def same_as_by_hand(pool_tokens, device: str) -> dict[str, bool]:
    """Per case: whether `pool_tokens` gives the rule's tokens (or slots) and counts, dtypes and shapes included."""
    result = {}
    for name, args in cases(device):
        got = pool_tokens(**args)
        want = by_hand(*(args[k] for k in ("chosen", "positions", "kpool", "pools", "n_pools", "tail_cap", "table")))
        result[name] = all(a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, want))
    return result


def test_the_torch_form_is_the_rule():
    same = same_as_by_hand(reference.pool_tokens, "cpu")
    assert all(same.values()), [name for name, ok in same.items() if not ok]


def test_the_cases_count_and_pad_as_meant():
    """The cases reach what they are named for: padding columns and an empty tail present, the cap changing
    something, a counted token in every query with a complete pool."""
    by_name = dict(cases("cpu"))
    tokens, counts = reference.pool_tokens(**by_name["padded choice"])
    assert not counts[:, 10 * 4 : 16 * 4].any()  # pools 10..15 pad the choice
    capped = reference.pool_tokens(**by_name["sparse, cap 16"])[1]
    uncapped = reference.pool_tokens(**by_name["sparse, cap None"])[1]
    assert not torch.equal(capped, uncapped)
    assert counts[:4].any(dim=1).all()
    assert not reference.pool_tokens(**by_name["no pool yet"])[1][:, :-4].any()


def test_the_kernel_gives_the_same_integers_under_the_interpreter():
    same = figures_of(__file__)
    assert same and all(same.values()), [name for name, ok in same.items() if not ok]


if __name__ == "__main__":  # under Triton's interpreter (tests/engine/interpreter.py)
    from engine.ops import triton_dsa

    figures = {}
    for block in (1024, 32):  # one program a row, several
        triton_dsa.POOL_TOKENS_BLOCK = block
        figures |= {f"{name}, block {block}": ok for name, ok in same_as_by_hand(triton_dsa.pool_tokens, "cpu").items()}
    print(json.dumps(figures))
