"""The reduced-precision dense products (engine/ops/triton_dense.py) on GLM-5.3-Flash's dense weight shapes, on the
GPU: time per call at 1, 2, 4, 8 (and 16, 64) rows for q4 and fp8, the bytes each call reads (the stored weight, the
activations in, the fp32 result out) as a fraction of HBM bandwidth, and the bf16 product of the same shape (the
serving path's `linear`, fixed 16-row blocks) beside it.

    python bench/dense_bench.py [--out FILE] [--tp 1,2] [--calls 20] [--rows 1,8] [--modes q4] [--names lm_head]
    python bench/dense_bench.py --sweep [--swept lm_head:fp8,tp2/kda_in_proj:q4,...] [--repeat 20] [--tuning sigma=1]
    python bench/dense_bench.py --engine /tmp/old ...   # a git worktree's engine (bench/other_tree.py)
    python bench/dense_bench.py --dequant [--out FILE] [--tp 1,2]

`--dequant`: what a prompt chunk's product with a reduced weight costs instead — the weight dequantised to bf16 in
one launch (`triton_dense.dequantized`, what `ops.linear` runs) against `QuantWeight.dequantize`'s torch steps (the
form before session 20), alone and followed by a 2,048-row matmul, µs a call (one call a CUDA graph).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from other_tree import from_argv

ENGINE = from_argv()  # --engine DIR: another checkout's engine (bench/other_tree.py)
ROOT = Path(__file__).resolve().parents[1]
if ENGINE is None:
    sys.path[:0] = [str(ROOT)]

from engine.models.glm5_next.config import TextConfig  # noqa: E402
from engine.ops import fused, reference  # noqa: E402
from engine.quant.dense import quantize  # noqa: E402

HBM_BYTES_S = 4.8e12  # H200 (an H100's 3.35e12: `hbm_bytes_s`)
ROWS = (1, 2, 4, 8, 16, 64)
L2_MISS_BYTES = 256 << 20  # the weight copies a multi-call graph reads add up to at least this (H200 L2: 50 MB)


def shapes(tp: int) -> dict[str, tuple[int, int]]:
    """[out, in] of each dense weight of one layer on one rank at TP=tp (the real config's widths)."""
    t = TextConfig.from_file(ROOT / "engine/checkpoint/glm53_flash_config.json")
    h, kd, kh = t.hidden_size, t.linear_head_dim, t.linear_num_heads
    heads, nope, v = t.num_attention_heads, t.qk_nope_head_dim, t.v_head_dim
    return {
        "kda_in_proj": ((3 * kh * kd + kh) // tp + 2 * kd, h),
        "kda_o_proj": (h, kh * kd // tp),
        "dsa_x_proj": (t.q_lora_rank + t.kv_lora_rank + 2 * t.index_head_dim + t.index_n_heads, h),
        "dsa_q_b": (heads * nope // tp, t.q_lora_rank),
        "dsa_o_proj": (h, heads * v // tp),
        "shared_gate_up": (2 * t.moe_intermediate_size // tp, h),
        "shared_down": (h, t.moe_intermediate_size // tp),
        "dense_gate_up": (2 * t.intermediate_size // tp, h),
        "dense_down": (h, t.intermediate_size // tp),
        "lm_head": (t.vocab_size // tp, h),
    }


def hbm_bytes_s() -> float:
    """The GPU's HBM bandwidth by its name: an H100's 3.35 TB/s, else the H200's."""
    return 3.35e12 if "H100" in torch.cuda.get_device_name() else HBM_BYTES_S


def timed(calls: list, repeat: int = 50) -> float:
    """Seconds a call: `calls` captured in one CUDA graph, replayed `repeat` times, the time divided among them. One
    call a graph includes the graph's launch latency (the tables' method since session 10); several, each over its own
    copy of the weight (`copies`), read HBM and not L2."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat / len(calls)


def copies(stored, held: int) -> list:
    """`stored` and enough copies of it (a QuantWeight's tensors cloned) that together they hold L2_MISS_BYTES, at
    `held` bytes each: calls cycling through them miss L2."""
    from engine.quant.dense import QuantWeight

    out = [stored]
    for _ in range(-(-L2_MISS_BYTES // held) - 1):
        if isinstance(stored, QuantWeight):
            offset = None if stored.offset is None else stored.offset.clone()
            out.append(QuantWeight(stored.mode, stored.data.clone(), stored.scale.clone(), offset, stored.group))
        else:
            out.append(stored.clone())
    return out


def chain(x: torch.Tensor, weights: list, calls: int, tuning: dict | None = None) -> list:
    """`calls` products of x cycling through `weights` (`tuning`: dense_rows's launch override)."""
    from engine.ops.triton_dense import dense_rows

    def one(w):
        return (lambda: dense_rows(x, w, tuning)) if tuning is not None else (lambda: fused.linear(x, w))

    return [one(weights[i % len(weights)]) for i in range(calls)]


# the served weights --sweep times by default: each in the mode DENSE=q4 stores it in (the LM head fp8:
# engine/quant/dense.py HEAD_MODE), at TP=1 and (the LM head, the KDA input projection) TP=2's shard
SWEPT = "lm_head:fp8,tp2/lm_head:fp8,kda_in_proj:q4,tp2/kda_in_proj:q4,dsa_o_proj:q4,dense_down:q4,kda_o_proj:q4"


def sweep(
    out_path: Path | None, swept: str, repeat: int, unrolls: tuple[int, ...] = (1, 2), base: dict | None = None
) -> None:
    """Time a grid of launch forms (outputs a program, warps, the split of the inputs, groups unrolled) on the
    `swept` weights ("[tp2/]NAME:MODE,..."; NAME from `shapes`; q4 unrolled by each of `unrolls`, fp8 by 2) at 1 and 8 rows — one row both with Triton's own
    compile of N == 1 and with the kernel compiled for any N (`one_row`) —, 20 calls a graph over copies that miss
    L2; then the table's own form and the grid's best three again, taking turns three times (medians)."""
    import itertools
    import statistics

    from engine.ops.triton_dense import launch_shape

    base = base or {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    hbm = hbm_bytes_s()
    found: dict = {}
    keys = ("block_o", "num_warps", "splits", "unroll", "one_row")
    for item in swept.split(","):
        label, mode = item.split(":")
        tp, name = (2, label[4:]) if label.startswith("tp2/") else (1, label)
        out, width = shapes(tp)[name]
        weight = (torch.randn(out, width, generator=gen, device="cuda") * 0.02).bfloat16()
        stored = quantize(weight, mode)
        del weight
        # the table's launch, `base` (--tuning, e.g. sigma=1) over it and over every form of the grid
        default = {**launch_shape(out, width, stored.group, mode == "fp8"), **base}  # type: ignore[union-attr]
        held = stored.nbytes()  # type: ignore[union-attr]
        weights = copies(stored, held)
        xs = {rows: torch.randn(rows, width, generator=gen, device="cuda") for rows in (1, 8)}
        splits = sorted({max(1, min(16, default["splits"] * f)) for f in (0.5, 1, 2, 4)})
        grid = [
            dict(block_o=b, num_warps=w, splits=int(sp), kw=8, unroll=u)
            for b, w, sp, u in itertools.product((64, 128), (2, 4), splits, (2,) if mode == "fp8" else unrolls)
            if width // (int(sp) * 64) >= 2
        ]

        def one(tuning: dict, rows: int) -> float:
            tuning = {**base, **tuning}
            return timed(chain(xs[rows], weights, max(20, len(weights)), tuning), repeat=repeat)

        results = []
        for tuning in grid:
            entry: dict = dict(tuning)
            try:
                entry["us_1"] = round(one({**tuning, "one_row": True}, 1) * 1e6, 2)
                entry["us_1_any"] = round(one({**tuning, "one_row": False}, 1) * 1e6, 2)
                entry["us_8"] = round(one(tuning, 8) * 1e6, 2)
            except Exception as exc:  # noqa: BLE001 - a form the compiler refuses is a result too
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                results.append(entry)
                continue
            entry["one_row"] = entry["us_1"] <= entry["us_1_any"]
            entry["us_1_own"], entry["us_1"] = entry["us_1"], min(entry["us_1"], entry["us_1_any"])
            results.append(entry)
        timed_ok = sorted((r for r in results if "us_8" in r), key=lambda r: r["us_1"] + r["us_8"])
        finalists = [default] + [
            {k: r[k] for k in (*keys, "kw")} for r in timed_ok if any(r[k] != default[k] for k in keys)
        ][:3]
        rounds: list[list[tuple[float, float]]] = [[] for _ in finalists]
        for _ in range(3):
            for i, tuning in enumerate(finalists):
                rounds[i].append((one(tuning, 1), one(tuning, 8)))
        confirmed = []
        for tuning, times in zip(finalists, rounds):
            entry = {k: tuning[k] for k in keys}
            for j, rows in enumerate((1, 8)):
                seconds = statistics.median(t[j] for t in times)
                moved = held + xs[rows].numel() * 4 + rows * out * 4
                entry[f"us_{rows}"] = round(seconds * 1e6, 2)
                entry[f"hbm_{rows}"] = round(moved / seconds / hbm, 3)
                entry[f"runs_us_{rows}"] = [round(t[j] * 1e6, 1) for t in times]
            confirmed.append(entry)
        found[item] = {"shape": [out, width], "default": confirmed[0], "confirmed": confirmed[1:], "grid": results}
        print(item, [out, width], "default", confirmed[0], "\n   best", confirmed[1:], flush=True)
        if out_path:
            out_path.write_text(json.dumps(found, indent=1))


def dequant(out_path: Path | None, tps: list[int]) -> None:
    """`--dequant` (the module docstring)."""
    from engine.ops.triton_dense import dequantized
    from engine.quant.dense import QuantWeight

    gen = torch.Generator(device="cuda").manual_seed(0)
    result: dict = {"gpu": torch.cuda.get_device_name(), "prompt_rows": 2048, "shapes": {}}
    for tp in tps:
        for name, (out, width) in shapes(tp).items():
            weight = (torch.randn(out, width, generator=gen, device="cuda") * 0.02).bfloat16()
            x = torch.randn(2048, width, generator=gen, device="cuda")
            row: dict = {"shape": [out, width]}
            for mode in ("q4", "fp8"):
                stored = quantize(weight, mode)
                assert isinstance(stored, QuantWeight), (name, mode)  # the shapes' widths hold whole groups
                moved = stored.nbytes() + out * width * 2
                one = timed([lambda: dequantized(stored)])
                row[mode] = {
                    "one_launch_us": round(one * 1e6, 1),
                    "one_launch_tb_s": round(moved / one / 1e12, 2),
                    "torch_steps_us": round(timed([lambda: stored.dequantize(torch.bfloat16)]) * 1e6, 1),
                    "prompt_product_us": round(timed([lambda: fused.linear(x, stored)]) * 1e6, 1),
                    "prompt_product_before_us": round(
                        timed([lambda: reference.linear(x, stored.dequantize(torch.bfloat16))]) * 1e6,
                        1,
                    ),
                    "bf16_product_us": round(timed([lambda: reference.linear(x, weight)]) * 1e6, 1),
                }
                print(f"tp{tp} {name} {out}x{width} {mode}: {row[mode]}", flush=True)
            result["shapes"][f"tp{tp}/{name}"] = row
            if out_path:
                out_path.write_text(json.dumps(result, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--sweep", action="store_true", help="time launch forms on the served weights instead")
    ap.add_argument("--swept", default=SWEPT, help="with --sweep: [tp2/]NAME:MODE of the weights swept")
    ap.add_argument("--unrolls", default="1,2", help="with --sweep: the q4 weights' groups unrolled (1, 2, 4)")
    ap.add_argument("--repeat", type=int, default=20, help="with --sweep: graph replays a timing")
    ap.add_argument(
        "--calls",
        type=int,
        default=1,
        help="products a CUDA graph holds (at least one a copy), cycling through copies of the weight that add up to "
        "256 MB, so each reads HBM (1: one call a graph, its launch latency included, the tables' method before "
        "2026-12-03)",
    )
    ap.add_argument("--dequant", action="store_true", help="a prompt chunk's dequantisation instead (docstring)")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts timed")
    ap.add_argument("--modes", default="bf16,q4,fp8", help="the weights' modes timed")
    ap.add_argument("--names", default="", help="the weights timed (`shapes`' names; empty: all)")
    ap.add_argument(
        "--tuning",
        default="",
        help="the reduced weights' launch overridden, e.g. block_o=256,num_warps=2 (launch_shape's keys); with "
        "--sweep, under every form swept (e.g. sigma=1)",
    )
    args = ap.parse_args()
    overrides = {k: int(v) for k, v in (kv.split("=") for kv in args.tuning.split(",") if kv)}
    if args.dequant:
        dequant(args.out, [int(t) for t in args.tp.split(",")])
        return
    if args.sweep:
        sweep(args.out, args.swept, args.repeat, tuple(int(u) for u in args.unrolls.split(",")), overrides)
        return
    hbm = hbm_bytes_s()
    reference.require_row_invariance()  # the bf16 baseline as the serving path runs it with drafts (16-row blocks)
    gen = torch.Generator(device="cuda").manual_seed(0)
    result: dict = {"gpu": torch.cuda.get_device_name(), "hbm_bytes_s": hbm, "calls": args.calls, "shapes": {}}
    result["launch"] = overrides or "the table's"
    result["engine"] = ENGINE or str(ROOT)
    for tp in (int(t) for t in args.tp.split(",")):
        for name, (out, width) in shapes(tp).items():
            if args.names and name not in args.names.split(","):
                continue
            weight = (torch.randn(out, width, generator=gen, device="cuda") * 0.02).bfloat16()
            row: dict = {"shape": [out, width]}
            weights = None
            for mode in args.modes.split(","):
                stored = weight if mode == "bf16" else quantize(weight, mode)
                if mode != "bf16" and isinstance(stored, torch.Tensor):  # q4 of a width not in whole groups (TP=3)
                    print(f"tp{tp} {name} {out}x{width} {mode}: kept as bf16 (not whole groups)", flush=True)
                    continue
                held = weight.numel() * 2 if mode == "bf16" else stored.nbytes()  # type: ignore[union-attr]
                figures = {}
                weights = copies(stored, held) if args.calls > 1 else [stored]
                count = max(args.calls, len(weights)) if args.calls > 1 else 1  # each copy read once a replay
                for rows in (int(r) for r in args.rows.split(",")):
                    x = torch.randn(rows, width, generator=gen, device="cuda")
                    tuning = dict(overrides) if overrides and mode != "bf16" else None
                    seconds = timed(chain(x, weights, count, tuning))
                    moved = held + x.numel() * 4 + rows * out * 4
                    figures[rows] = {
                        "us": round(seconds * 1e6, 1),
                        "hbm_fraction": round(moved / seconds / hbm, 3),
                    }
                row[mode] = figures
                print(
                    f"tp{tp} {name} {out}x{width} {mode}: "
                    + ", ".join(f"{r}: {f['us']} us {f['hbm_fraction']:.0%}" for r, f in figures.items()),
                    flush=True,
                )
            result["shapes"][f"tp{tp}/{name}"] = row
            del weight, weights
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
