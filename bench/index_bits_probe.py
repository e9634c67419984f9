"""Which of DSA's indexer forms give a query the same bits (session 34). tests/gpu/test_rows_gpu.py's fp8 case found
a decode step's scores (each query its own e4m3 keys, converted in the kernel, q split there, 64 pools a program) in
other last bits than a prompt chunk's (one bf16 copy of the stored values, q's parts made once, 128 pools a program
on Hopper), while bf16 keys agreed. Each variant below changes one of those differences; the table says, for the
test's four queries, how many of their scores differ from the chunk's (or the named reference's) and by how much,
and each form's worst relative error against the float64 sums (meaningless in the "scales 1" rows, whose keys are
no longer the ones the float64 sums took). Session 34's first run: only the fp8 step differed, whatever its launch,
with or without FMA contraction and with every scale 1 — the e4m3 operands' layout (kWidth 4, see
`triton_dsa._bf16_boundary`); its second, with the boundary, none.
    python bench/index_bits_probe.py --kinds bf16,fp8 --contexts 8192,32768 --out probe.json"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from engine.cache import KVPool
from engine.ops import reference, triton_dsa


@contextlib.contextmanager
def changed(**knobs):
    """triton_dsa's launch dicts / module knobs changed for the block: launch=..., parts_launch=..., fusion=..."""
    saved = (dict(triton_dsa.INDEX_LAUNCH), dict(triton_dsa.INDEX_LAUNCH_PARTS), triton_dsa.INDEX_FP_FUSION)
    triton_dsa.INDEX_LAUNCH.update(knobs.get("launch", {}))
    triton_dsa.INDEX_LAUNCH_PARTS.update(knobs.get("parts_launch", {}))
    triton_dsa.INDEX_FP_FUSION = knobs.get("fusion", triton_dsa.INDEX_FP_FUSION)
    try:
        yield
    finally:
        triton_dsa.INDEX_LAUNCH.update(saved[0])
        triton_dsa.INDEX_LAUNCH_PARTS.update(saved[1])
        triton_dsa.INDEX_FP_FUSION = saved[2]


def probe(kind: str, contexts: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(8)
    t, pools = 2048, contexts // 16
    rows = torch.tensor([0, 1, 777, t - 1], device="cuda")
    pool = KVPool(1, pools * 2, 768, kind, "cuda")
    pool.write(0, torch.arange(pools * 2, device="cuda"), torch.randn(pools * 2, 768, device="cuda", generator=g))
    ends = torch.randperm(pools * 2, device="cuda", generator=g)[:pools][None]
    keys = reference.PoolKeys(pool, 0, slice(512, 640), ends)
    own = reference.PoolKeys(pool, 0, slice(512, 640), ends.expand(4, -1))
    q = torch.randn(t, 32, 128, device="cuda", generator=g)
    head_w = torch.randn(t, 32, device="cuda", generator=g) * 0.2
    positions = torch.arange(contexts - t, contexts, device="cuda")
    held = keys.read()[0]
    want = (
        torch.einsum(
            "th,thp->tp",
            head_w[rows].double(),
            torch.relu(torch.einsum("thd,pd->thp", q[rows].double(), held.double())),
        )
        * 128**-0.5
    )
    hidden = (torch.arange(pools, device="cuda") * 16 + 15)[None, :] > positions[rows][:, None]

    def chunk() -> torch.Tensor:
        return triton_dsa.index_scores(q, keys, head_w, positions, 16, 128**-0.5)[rows]

    def step() -> torch.Tensor:
        return triton_dsa.index_scores(q[rows], own, head_w[rows], positions[rows], 16, 128**-0.5)

    def alone() -> torch.Tensor:  # one query at a time against the shared keys: t = 1 takes them as its own
        return torch.cat([
            triton_dsa.index_scores(q[i : i + 1], keys, head_w[i : i + 1], positions[i : i + 1], 16, 128**-0.5)
            for i in rows.tolist()
        ])  # fmt: skip

    results: dict = {}
    base = chunk()

    def record(name: str, got: torch.Tensor, ref: torch.Tensor | None = None) -> None:
        """got's scores against ref's (the default chunk's unless given) and float64's"""
        ref = base if ref is None else ref
        differ = (got != ref) & ~hidden
        err = (got.double().masked_fill(hidden, 0) - want.masked_fill(hidden, 0)).abs().max() / want.abs().max()
        results[name] = {
            "differ": int(differ.sum()),
            "of": int((~hidden).sum()),
            "max_abs_diff": float((got - ref).masked_fill(hidden, 0).abs().max()),
            "rel_err_vs_f64": float(err),
        }
        print(f"{kind} {contexts} {name:48s} {results[name]}", flush=True)

    record("chunk", base)
    record("step", step())
    record("alone (t=1, shared keys as its own)", alone())
    with changed(parts_launch={"pools": 64}):
        record("chunk, 64 pools a program", chunk())
    with changed(launch={"pools": 128}):
        record("step, 128 pools a program", step())
    with changed(fusion=False):
        plain = chunk()
        record("chunk, no FMA contraction", plain)
        record("step, no FMA contraction (against that chunk)", step(), plain)
    with changed(launch={"num_warps": 8}):
        record("step, 8 warps", step())
    if pool.scales is not None:  # every row's scale 1: the same stored e4m3 values, no scale on the products
        pool.scales[0].fill_(1.0)
        ones = chunk()
        record("scales 1: chunk (against the chunk)", ones, ones)
        record("scales 1: step (against that chunk)", step(), ones)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="bf16,fp8")
    ap.add_argument("--contexts", default="32768")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    found = {
        f"{kind}-{contexts}": probe(kind, int(contexts))
        for kind in a.kinds.split(",")
        for contexts in a.contexts.split(",")
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
