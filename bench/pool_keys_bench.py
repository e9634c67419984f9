"""What a decode step's DSA indexer spends on its keys, before and after the pool keys were stored (session 28).

Before, every step of every indexer layer read the index columns of its whole span (each token's key and gate score,
2 × 128 values) and pooled them (softmax over each pool's gate scores, weighted sum of its keys); now each pool's key
is made once, when its last token is written, and a step reads the key columns of every kpool-th row (128 values a
pool). Both are timed here on one pool layer at the released widths (kv_lora_rank 512, index_head_dim 128, kpool 4),
batch 1, with the scoring both share (`ops.index_scores`, 32 heads) after them, for each cache row type and span;
and what the new form adds to a step: the new row written, its pool's key made and the row written again
(`after_completion_ms`; on CUDA the one launch of engine/ops/triton_dsa.py, on the CPU the torch form). On CUDA also
the serving step's form of the scores: the keys read in the pool by slot (`after_in_place_with_scores_ms`).

Then the choice among the scored pools (session 29): the best index_topk / kpool = 512 pools, before by a stable sort
of every pool's score (and for a step a sort of the 512 chosen into position order), now by `ops.top_pools` (a
selection, no sort): for the step's one query (`select_*_ms`, the scores above) and for a prompt chunk's queries
ending at the span (`chunk_select_*_ms`, `--chunk` queries, random scores with each query's invisible pools masked;
since session 32 the chunk's `top_pools` is engine/ops/triton_dsa.py's kernel on CUDA, and `chunk_select_torch_ms`
the torch form beside it).

With `--select-rows 1,64,2048` only the choice is timed (session 33): for each span and each count of queries, the
torch form (`torch_ms`), engine/ops/triton_dsa.py's kernels with a query's span cut into segments as launched
(`kernel_ms`, `segment`: pools a program) and with one segment a query (`one_segment_ms`, session 32's shape); ms a
call, from a graph of 10 calls below 512 queries (the replay's own cost spread over them).

    python bench/pool_keys_bench.py [--spans 4096,32768,131072] [--kv fp32,bf16,fp8] [--chunk N] [--out FILE]
    python bench/pool_keys_bench.py --select-rows 1,8,64,128,512,2048 --spans 32768,131072,524288,1048576

On a GPU each form runs as a CUDA graph (as the serving step does); on the CPU eagerly.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import ops  # noqa: E402
from engine.cache import KVPool  # noqa: E402
from engine.models.glm5_next.dsa import pool_keys  # noqa: E402

RANK, DIM, HEADS, KPOOL, PICK = 512, 128, 32, 4, 512


def by_sort(index: torch.Tensor, in_position_order: bool = True) -> torch.Tensor:
    """The pools chosen as `_select_tokens` chose them before session 29: a stable sort of the scores, its first
    PICK, and for a step (the lane step's form, `in_position_order`) sorted again into position order; a prompt
    chunk kept them in score order."""
    chosen = index.sort(dim=-1, descending=True, stable=True).indices[:, :PICK]
    return chosen.sort(dim=-1).values if in_position_order else chosen


def chunk_scores(rows: int, span: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """[rows, span / kpool] scores of a prompt chunk's queries at span - rows .. span - 1, invisible pools masked."""
    index = torch.randn(rows, span // KPOOL, generator=gen, device=device)
    positions = torch.arange(span - rows, span, device=device)
    return index.masked_fill(~ops.visible_pools(span // KPOOL, KPOOL, positions), torch.finfo(torch.float32).min)


def old_keys(pool: KVPool, table: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """The step's keys as every step made them before: the span's index columns read and pooled."""
    rows = pool.read(0, table, columns=slice(RANK, None))
    n = rows.shape[1] // KPOOL
    span = rows[:, : n * KPOOL].reshape(rows.shape[0], n, KPOOL, 2 * DIM)
    return (torch.softmax(span[..., DIM:] + ape, dim=-2) * span[..., :DIM]).sum(-2)


def new_keys(pool: KVPool, table: torch.Tensor) -> torch.Tensor:
    """The step's keys now: each pool's last row's key columns."""
    ends = table[:, KPOOL - 1 : (table.shape[1] // KPOOL) * KPOOL : KPOOL]
    return pool.read(0, ends, columns=slice(RANK, RANK + DIM))


def in_place(pool: KVPool, table: torch.Tensor) -> ops.PoolKeys:
    """The step's keys as `SparseMLA.decode_lanes` hands them to the indexer on CUDA: left in the pool, by slot."""
    ends = table[:, KPOOL - 1 : (table.shape[1] // KPOOL) * KPOOL : KPOOL]
    return ops.PoolKeys(pool, 0, slice(RANK, RANK + DIM), ends)


def completion(pool: KVPool, table: torch.Tensor, ape: torch.Tensor, row: torch.Tensor, where: torch.Tensor) -> None:
    """What a step now adds: the new row written, then its pool's key made from its pool's rows and the row written
    again as `SparseMLA.decode_lanes` does it — on CUDA one launch (`ops.complete_pools`), on the CPU the torch form
    (every row's key made, kept where the row completes its pool)."""
    position = table.shape[1] - 1  # `where` [1]: it on the device (a graph captures no host copy)
    slot = table[:, position]
    pool.write(0, slot, row)
    if ops.complete_pools_applies(row, DIM, pool.scales is not None):
        ops.complete_pools(pool.rows[0], None if pool.scales is None else pool.scales[0], row, slot, where, table, ape,
                           RANK, KPOOL)  # fmt: skip
        return
    members = pool.read(0, table[:, position - KPOOL + 1 : position + 1], columns=slice(RANK, None))  # [1, kpool, 2d]
    key = torch.where((where % KPOOL == KPOOL - 1)[:, None], pool_keys(members, ape), row[:, RANK : RANK + DIM])
    pool.write(0, slot, torch.cat([row[:, :RANK], key, row[:, RANK + DIM :]], dim=-1))


def timed(fn, device: str, repeats: int) -> float:
    """Median seconds of fn() (a CUDA graph of it on a GPU)."""
    if device == "cuda":
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    else:
        run = fn
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def select_rows(spans: list[int], counts: list[int], repeats: int) -> dict:
    """The choice alone (CUDA): the torch form against the kernels, segmented as launched and one segment a query,
    for `counts` queries ending at each span (random scores, invisible pools masked); ms, graphed."""
    from engine.ops import triton_dsa

    gen = torch.Generator(device="cuda").manual_seed(1)
    launch = triton_dsa.TOP_POOLS_LAUNCH
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d"), "launch": dict(launch), "runs": {}}  # fmt: skip
    for span in spans:
        for rows in counts:
            index = chunk_scores(rows, span, gen, "cuda")
            want = ops.reference.top_pools(index, PICK)
            assert torch.equal(triton_dsa.top_pools(index, PICK), want)
            got = {"pools": span // KPOOL, "segment": triton_dsa.top_pools_segments(rows, span // KPOOL)}
            calls = 10 if rows < 512 else 1  # a graph of 10 calls for few rows: the replay's own cost spread

            def ms(choose) -> float:
                return timed(lambda: [choose(index, PICK) for _ in range(calls)], "cuda", repeats) * 1e3 / calls

            got["calls_a_graph"] = calls
            got["torch_ms"] = ms(ops.reference.top_pools)
            got["kernel_ms"] = ms(triton_dsa.top_pools)
            aimed, launch["programs"] = launch["programs"], 1  # one segment a query
            try:
                assert torch.equal(triton_dsa.top_pools(index, PICK), want)
                got["one_segment_ms"] = ms(triton_dsa.top_pools)
            finally:
                launch["programs"] = aimed
            got = {k: round(v, 3) if isinstance(v, float) else v for k, v in got.items()}
            result["runs"][f"s{span}_r{rows}"] = got
            print(span, rows, got, flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", default="4096,32768,131072")
    ap.add_argument("--kv", default="fp32,bf16,fp8")
    ap.add_argument(
        "--chunk", type=int, default=0, help="a prompt chunk's queries (default: 2048 on a GPU, 128 on the CPU)"
    )
    ap.add_argument("--repeats", type=int, default=0, help="timed runs of each (default: 50 on a GPU, 5 on the CPU)")
    ap.add_argument("--select-rows", default="", help="only the choice, for these counts of queries (CUDA)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    repeats = args.repeats or (50 if device == "cuda" else 5)
    if args.select_rows:
        result = select_rows([int(s) for s in args.spans.split(",")], [int(r) for r in args.select_rows.split(",")],
                             repeats)  # fmt: skip
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        return
    chunk = args.chunk or (2048 if device == "cuda" else 128)
    gen = torch.Generator(device=device).manual_seed(0)
    ape = torch.randn(KPOOL, DIM, generator=gen, device=device)
    q = torch.randn(1, HEADS, DIM, generator=gen, device=device)
    head_w = torch.randn(1, HEADS, generator=gen, device=device)
    result: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "widths": {"kv_lora_rank": RANK, "index_head_dim": DIM, "index_heads": HEADS, "kpool": KPOOL},
        "runs": {},
    }
    for kv in args.kv.split(","):
        for span in (int(s) for s in args.spans.split(",")):
            pool = KVPool(1, span, RANK + 2 * DIM, kv, device)
            pool.write(0, torch.arange(span, device=device), torch.randn(span, RANK + 2 * DIM, device=device))
            table = torch.randperm(span, generator=gen, device=device)[None]  # slots scattered, as a pool hands out
            position = torch.tensor([span - 1], device=device)
            row = torch.randn(1, RANK + 2 * DIM, generator=gen, device=device)
            scale = DIM**-0.5

            def score(keys: torch.Tensor) -> torch.Tensor:
                return ops.index_scores(q, keys, head_w, position, KPOOL, scale)

            got = {
                "before_keys_ms": timed(lambda: old_keys(pool, table, ape), device, repeats) * 1e3,
                "after_keys_ms": timed(lambda: new_keys(pool, table), device, repeats) * 1e3,
                "before_with_scores_ms": timed(lambda: score(old_keys(pool, table, ape)), device, repeats) * 1e3,
                "after_with_scores_ms": timed(lambda: score(new_keys(pool, table)), device, repeats) * 1e3,
                "after_completion_ms": timed(lambda: completion(pool, table, ape, row, position), device, repeats)
                * 1e3,
            }
            if device == "cuda":  # the serving step's form: the indexer's kernel reads the keys in the pool by slot
                got["after_in_place_with_scores_ms"] = (
                    timed(lambda: score(in_place(pool, table)), device, repeats) * 1e3
                )
            index = score(new_keys(pool, table))
            assert torch.equal(by_sort(index), ops.top_pools(index, PICK))
            got["select_sort_ms"] = timed(lambda: by_sort(index), device, repeats) * 1e3
            got["select_top_pools_ms"] = timed(lambda: ops.top_pools(index, PICK), device, repeats) * 1e3
            if kv == args.kv.split(",")[0]:  # the chunk's scores do not depend on the row type: once a span
                many = chunk_scores(chunk, span, gen, device)
                got["chunk_rows"] = chunk
                got["chunk_select_sort_ms"] = timed(lambda: by_sort(many, False), device, repeats) * 1e3
                got["chunk_select_top_pools_ms"] = timed(lambda: ops.top_pools(many, PICK), device, repeats) * 1e3
                if device == "cuda":  # the torch form beside the kernel (session 32); on the CPU they are one
                    assert torch.equal(ops.top_pools(many, PICK), ops.reference.top_pools(many, PICK))
                    got["chunk_select_torch_ms"] = (
                        timed(lambda: ops.reference.top_pools(many, PICK), device, repeats) * 1e3
                    )
                del many
            item = pool.rows.element_size()
            got["bytes_read_before"] = span * (2 * DIM * item + (4 if kv == "fp8" else 0))
            got["bytes_read_after"] = span // KPOOL * (DIM * item + (4 if kv == "fp8" else 0))
            got = {k: round(v, 3) if isinstance(v, float) else v for k, v in got.items()}
            result["runs"][f"{kv}_s{span}"] = got
            print(kv, span, got, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
