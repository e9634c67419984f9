"""DSA's pool choice without a sort (engine/ops/reference.py `top_pools`): the k best pools of each query are exactly
the first k of a stable descending sort — the rule `_select_tokens` defines, ties to the earlier pool — in position
order, for scores with many exact ties, for spans with fewer visible pools than k (the invisible ones at fp32's
lowest), and for k equal to the span. The same for its kernels (engine/ops/triton_dsa.py `top_pools`, what CUDA
runs) under Triton's interpreter, with a query's span in one segment, in a few and in one a block, and in the
one-launch form (`_pool_select`: a program a query, every pass) for short spans and for one segment a query.
tests/gpu/test_pool_keys_gpu.py runs the same cases on CUDA (the kernels), eagerly and in a graph, repeated to a
prompt chunk's rows, and for a 1M span's few queries."""

from __future__ import annotations

import json

import pytest
import torch
from interpreter import figures_of

from engine import ops

LOWEST = torch.finfo(torch.float32).min


def by_sort(index: torch.Tensor, k: int) -> torch.Tensor:
    """The rule as `_select_tokens` wrote it before top_pools: a stable descending sort, its first k, by position."""
    return index.sort(dim=-1, descending=True, stable=True).indices[:, :k].sort(dim=-1).values


def cases(device: str) -> list[tuple[str, torch.Tensor, int]]:
    """(name, scores [T, P], k): random scores, coarse ones (most scores tie), a tie straddling the k-th place, the
    invisible tail of a span, fewer visible pools than k, k equal to the span, signed zeros tied, and
    a span shorter than a pool."""
    gen = torch.Generator().manual_seed(7)
    out = []
    out.append(("random", torch.randn(3, 4096, generator=gen), 512))
    out.append(("coarse", torch.randint(0, 4, (4, 3000), generator=gen).float(), 512))
    straddle = torch.randn(2, 2048, generator=gen)
    straddle[:, ::3] = 2.5  # 683 pools tie above the rest: the k-th place falls inside the tie
    out.append(("tie at the k-th place", straddle, 512))
    span = torch.randn(5, 8192, generator=gen)
    span[:, 6000:] = LOWEST  # the invisible pools of a padded span
    out.append(("invisible tail", span, 512))
    few = torch.randn(3, 700, generator=gen)
    few[:, 300:] = LOWEST  # 300 visible pools, 512 picked: the dense regime's padding among the invisible
    out.append(("fewer visible than k", few, 512))
    out.append(("k equals the span", torch.randn(2, 96, generator=gen), 96))
    zeros = torch.zeros(2, 1024)
    zeros[:, 1::2] = -0.0  # every ReLU of every head zero: +0 and -0 tie
    zeros[:, 500:520] = 1.0
    out.append(("signed zeros", zeros, 64))
    out.append(("no pools yet", torch.zeros(3, 0), 0))
    return [(name, x.to(device), k) for name, x, k in out]


def check_cases(device: str) -> None:
    for name, index, k in cases(device):
        got = ops.top_pools(index, k)
        assert got.shape == (index.shape[0], k) and got.dtype == torch.int64, name
        assert torch.equal(got, by_sort(index, k)), name


def test_top_pools_is_the_first_k_of_the_stable_sort_in_position_order():
    check_cases("cpu")


@pytest.mark.parametrize("k", [1, 7, 512])
def test_top_pools_of_a_row_do_not_depend_on_the_other_rows(k):
    gen = torch.Generator().manual_seed(3)
    index = torch.randint(0, 6, (6, 2000), generator=gen).float()
    whole = ops.top_pools(index, k)
    for i in range(index.shape[0]):
        assert torch.equal(ops.top_pools(index[i : i + 1], k), whole[i : i + 1])


def test_the_kernel_takes_the_same_pools_under_the_interpreter():
    same = figures_of(__file__)
    assert same and all(same.values()), [name for name, ok in same.items() if not ok]


if __name__ == "__main__":  # under Triton's interpreter (tests/engine/interpreter.py): the kernel on every case
    from engine.ops import triton_dsa

    triton_dsa.TOP_POOLS_LAUNCH["block"] = 256  # several blocks a row at these spans
    same = {}
    for programs in (1024, 12, 1):  # a segment a block (most), a few blocks a segment, one segment a query
        triton_dsa.TOP_POOLS_LAUNCH["programs"] = programs
        # 0: the segmented launches (a span of one segment still takes the one launch); 768: spans of up to 3 blocks
        # in the one launch too
        for one_launch in (0, 768):
            triton_dsa.TOP_POOLS_LAUNCH["one_launch_pools"] = one_launch
            for name, x, k in cases("cpu"):
                got = triton_dsa.top_pools(x, k)
                same[f"{name}, {programs} programs, one launch to {one_launch}"] = torch.equal(got, by_sort(x, k))
    print(json.dumps(same))
