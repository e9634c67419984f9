"""Every kernel of one decode step, in order, with the code that launched it: where a batch-1 step's time goes
between the large products (bench/gpu_engine.py's random weights, full width, the decoder a server with drafts uses).

    python bench/decode_trace.py [--layers KKKD] [--exl3-experts] [--shard 2] [--dense q4] [--out trace.json]
    python bench/decode_trace.py --prefill 8192 [...]   # the 2,048-token prompt chunk ending at 8,192 instead

Two runs of the same step under torch.profiler:
- eager (no graphs), every `engine.ops` function and the layers' own calls wrapped in a `record_function` range, so
  each kernel is named with the innermost range whose CPU span holds its launch (chrome trace: the launch's
  correlation id);
- replayed from the CUDA graph (what serves): the kernels in order, each with its GPU time and the idle gap before it.
With --prefill: first the chunk's wall-clock time (three runs) and an unannotated trace recording only the GPU (its
kernel time against its span: how long the GPU waits on the host, and the widest waits with the kernels around them),
then the annotated eager run. Written: the ordered list of both, and per scope the launches and GPU time (graphed
times matched to eager scopes by position when the two lists have the same kernels).
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_engine import build, lane_inputs, prompt_ids  # noqa: E402

from engine import ops  # noqa: E402
from engine.models.glm5_next import dsa, kda, mhc, moe, mtp  # noqa: E402
from engine.models.glm5_next import model as model_module  # noqa: E402
from engine.parallel import ParallelGroup  # noqa: E402
from engine.runner.lanes import LaneDecoder  # noqa: E402

METHODS = [
    (moe.MoE, ("__call__", "route", "_decode")),
    (moe.DenseMLP, ("__call__",)),
    (moe.SwiGLU, ("partial",)),
    (kda.KimiDeltaAttention, ("decode_lanes", "_fused_project", "_fused_core", "_gates", "_output")),
    (dsa.SparseMLA, ("decode_lanes", "_rows", "_select_lanes", "_attend_lanes", "_pool_keys")),
    (mhc.HyperConnection, ("around",)),
    (mtp.MtpLayer, ("forward",)),
]
# the prompt path's own methods (--prefill)
PROMPT_METHODS = [
    (moe.MoE, ("_grouped",)),
    (ops.Exl3Experts, ("__call__",)),
    (kda.KimiDeltaAttention, ("prefill", "_project", "_recur")),
    (dsa.SparseMLA, ("prefill", "_select", "_attend", "_attend_split", "_attend_selected", "_stream")),
    (model_module.Glm5NextForCausalLM, ("_embed", "_logits", "_mtp_prefill")),
]


def _wrapped(name: str, fn):
    @functools.wraps(fn)
    def inner(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)

    return inner


def annotate(prompt: bool = False) -> None:
    """Every public function of engine.ops and the methods above (with `prompt`, the prompt path's too) inside a
    range of its own name."""
    methods = METHODS + (PROMPT_METHODS if prompt else [])
    for name in dir(ops):
        fn = getattr(ops, name)
        if not name.startswith("_") and callable(fn) and not isinstance(fn, type) and hasattr(fn, "__module__"):
            setattr(ops, name, _wrapped(f"ops.{name}", fn))
    for cls, names in methods:
        for name in names:
            if hasattr(cls, name):
                setattr(cls, name, _wrapped(f"{cls.__name__}.{name}", getattr(cls, name)))
    for name in ("sum_partials", "gather", "all_gather", "all_reduce"):
        if hasattr(ParallelGroup, name):
            setattr(ParallelGroup, name, _wrapped(f"group.{name}", getattr(ParallelGroup, name)))


def traced(fn, cpu: bool = True) -> list[dict]:
    """One call of `fn` under torch.profiler: its kernels in GPU order (name, µs, gap before it in µs, scope; without
    `cpu` the host side is not recorded - less overhead on it, no scopes)."""
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA] + ([torch.profiler.ProfilerActivity.CPU] if cpu else [])
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    ranges = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in events if e.get("cat") == "user_annotation"
    )
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    kernels = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"]
    )
    out, last_end = [], None
    for e in kernels:
        at = launches.get(e.get("args", {}).get("correlation"))
        scope = "-"
        if at is not None:
            inside = [r for r in ranges if r[0] <= at <= r[1]]
            if inside:
                scope = min(inside, key=lambda r: r[1] - r[0])[2]
        out.append(
            {
                "kernel": e["name"][:80],
                "us": round(e.get("dur", 0), 2),
                "gap_us": round(e["ts"] - last_end, 2) if last_end is not None else 0.0,
                "scope": scope,
            }
        )
        last_end = e["ts"] + e.get("dur", 0)
    return out


def write(path: str | None, result: dict) -> None:
    """The result as JSON at `path` (gzipped where it ends in .gz); nothing without one."""
    if path:
        with gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w") as f:
            json.dump(result, f, indent=1)


def tally(rows: list[dict], key: str) -> list[dict]:
    """Launches and GPU time per value of `key` ("scope" or "kernel"), the most time first."""
    table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for row in rows:
        table[row[key]][0] += 1
        table[row[key]][1] += row["us"]
    return [{key: k, "launches": n, "us": round(us, 1)} for k, (n, us) in sorted(table.items(), key=lambda i: -i[1][1])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="KKKD")
    parser.add_argument("--exl3-experts", action="store_true")
    parser.add_argument("--shard", type=int, default=1)
    parser.add_argument("--dense", choices=("bf16", "q4", "fp8"), default="bf16")
    parser.add_argument("--window", type=int, default=4, help="the decoder's verify window (1: drafts off)")
    parser.add_argument("--prefill", type=int, default=0, help="trace the 2,048-token prompt chunk ending here")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model, cfg = build(
        args.layers,
        "cuda",
        ROOT / "engine/checkpoint/glm53_flash_config.json",
        exl3_experts=args.exl3_experts,
        shard=args.shard,
        dense=args.dense,
    )
    if args.prefill:
        return prefill_trace(model, cfg, args)
    pool = model.make_pool(8192, "bf16")
    prompts, tokens = lane_inputs(prompt_ids(cfg, 128), 1)
    result: dict = vars(args).copy()
    with torch.no_grad():
        graphed = LaneDecoder(model, pool, 1, graphs=True, window=args.window)
        seq = graphed.new_sequence(0)
        model.prefill(seq, prompts[0])
        for _ in range(3):
            graphed.decode([seq], tokens)  # capture, warm
        result["graphed"] = traced(lambda: graphed.decode([seq], tokens))
        if args.window > 1:  # a verify step of the whole window (the pending token and window - 1 drafts)
            rows = [[tokens[0] + 7 * t for t in range(args.window)]]
            for _ in range(2):
                graphed.verify([seq], rows)
            result["graphed_verify"] = traced(lambda: graphed.verify([seq], rows))
            result["graphed_verify_by_name"] = tally(result["graphed_verify"], "kernel")
        seq.release()
        annotate()
        eager = LaneDecoder(model, pool, 1, graphs=False, window=args.window)
        seq = eager.new_sequence(0)
        model.prefill(seq, prompts[0])
        for _ in range(2):
            eager.decode([seq], tokens)
        result["eager"] = traced(lambda: eager.decode([seq], tokens))
        seq.release()
    g, e = result["graphed"], result["eager"]
    same = len(g) == len(e) and all(a["kernel"] == b["kernel"] for a, b in zip(g, e))
    result["graphed_matches_eager"] = same
    if same:
        for a, b in zip(g, e):
            a["scope"] = b["scope"]
    result["graphed_total_us"] = round(sum(r["us"] + r["gap_us"] for r in g), 1)
    result["graphed_kernel_us"] = round(sum(r["us"] for r in g), 1)
    result["graphed_by_scope"] = tally(g, "scope") if same else None
    result["eager_by_scope"] = tally(e, "scope")
    result["graphed_by_name"] = tally(g, "kernel")
    print(json.dumps({k: v for k, v in result.items() if k not in ("graphed", "eager", "graphed_verify")}, indent=1))
    write(args.out, result)


def prefill_trace(model, cfg, args) -> None:
    """The 2,048-token chunk ending at `args.prefill`, eager (a prompt chunk is never graphed), after the same
    prompt once untraced (compiles, autotunes): its kernels in order with their scopes, and the tallies."""
    chunk = 2048
    if args.prefill < chunk or args.prefill % chunk:
        raise SystemExit(f"--prefill {args.prefill}: a multiple of {chunk}")
    pool = model.make_pool(args.prefill + 64, "bf16")
    ids = prompt_ids(cfg, args.prefill)
    result: dict = vars(args).copy()

    def run(measure):
        """`measure` of a thunk running the last chunk, the earlier ones prefilled untimed."""
        seq = model.new_sequence(pool)
        try:
            for start in range(0, args.prefill - chunk, chunk):
                model.prefill(seq, ids[start : start + chunk])
            torch.cuda.synchronize()
            return measure(lambda: model.prefill(seq, ids[args.prefill - chunk :]))
        finally:
            seq.release()

    def wall_ms(fn) -> float:
        torch.cuda.synchronize()
        begin = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - begin) * 1e3

    with torch.no_grad():
        run(lambda fn: fn())  # compiles, autotunes
        # the GPU's idle time within the chunk as it serves: wall clock, then kernels with nothing recorded on the host
        result["wall_ms"] = sorted(run(wall_ms) for _ in range(3))
        plain = run(lambda fn: traced(fn, cpu=False))
        annotate(prompt=True)
        rows = run(traced)
    result["plain_kernel_us"] = round(sum(r["us"] for r in plain), 1)
    result["plain_span_us"] = round(sum(r["us"] + r["gap_us"] for r in plain), 1)
    widest = sorted(range(1, len(plain)), key=lambda i: -plain[i]["gap_us"])[:20]
    result["plain_widest_gaps"] = [
        {"gap_us": plain[i]["gap_us"], "after": plain[i - 1]["kernel"], "before": plain[i]["kernel"], "at": i}
        for i in widest
    ]
    result["kernel_us"] = round(sum(r["us"] for r in rows), 1)
    result["span_us"] = round(sum(r["us"] + r["gap_us"] for r in rows), 1)
    result["launches"] = len(rows)
    result["by_scope"] = tally(rows, "scope")
    for row in rows:
        row["scope_kernel"] = f"{row['scope']} | {row['kernel'][:60]}"
    result["by_scope_kernel"] = tally(rows, "scope_kernel")[:80]
    result["by_name"] = tally(rows, "kernel")[:60]
    shown = ("wall_ms", "plain_kernel_us", "plain_span_us", "kernel_us", "span_us", "launches", "by_scope")
    print(json.dumps({k: result[k] for k in shown}, indent=1))
    for gap in result["plain_widest_gaps"]:
        print(f"gap {gap['gap_us']:8.1f} us at {gap['at']}: {gap['after'][:50]} -> {gap['before'][:50]}")
    for row in result["by_scope_kernel"][:40]:
        print(f"{row['us']:10.1f} us x{row['launches']:<5} {row['scope_kernel']}")
    result["kernels"] = rows
    write(args.out, result)


if __name__ == "__main__":
    main()
