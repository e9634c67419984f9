"""What sampling one token costs rank 0 at the served vocabulary (engine/sampling.py), on the host or a GPU.

The scheduler samples every row of a decode step from fp32 logits where the step made them (a GPU since session
38; the host before): a lane's pending token and each draft row it verifies; a row at a time until session 39, the
step's rows together on a GPU since (`sample_rows`). This times
`sample`, `token_logprobs` (for requests that ask for log-probabilities) and `rows_logprobs` (a prompt's rows, for
completions' echo; a block of 64, ms a row) on rows of GLM-5.3-Flash's vocabulary, 154,880 tokens, for the
parameter sets clients send, on two kinds of row:
- `peaked`: a language model's shape — a bulk of logits around -2 (sd 2.5) and 40 tokens raised 8–25 above it;
- `flat`: normal logits (sd 3), the worst case for anything that narrows the candidates by score.
Each figure is the median of --calls calls (positions differ, so the noise differs), after 3 warm-up calls.

    python bench/sampling_bench.py --out bench/results/DATE-cpu-sampling.json
    python bench/sampling_bench.py --device cuda --out ...   # the rows on the GPU (each draw ends in a host read;
        # and a step's rows together, `sample_rows`: 4 and 16 rows a call, ms a row, eager and (since session 40)
        # replayed from CUDA graphs; --profile: where a call goes)
    git worktree add /tmp/old REV && python bench/sampling_bench.py --engine /tmp/old ...   # that commit's engine
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from other_tree import from_argv

ENGINE = from_argv()  # --engine DIR: another checkout's engine (bench/other_tree.py)
from engine.sampling import SamplingParams, sample, token_logprobs  # noqa: E402

try:  # since session 38 (an earlier commit's engine, under --engine, has no prompt-rows form)
    from engine.sampling import DEVICE_ROWS, rows_logprobs  # noqa: E402
except ImportError:
    DEVICE_ROWS, rows_logprobs = 64, None
try:  # since session 39: a decode step's rows sampled together on a GPU
    from engine.sampling import sample_rows  # noqa: E402
except ImportError:
    sample_rows = None
try:  # since session 40: the passes replayed from CUDA graphs
    from engine.sampling import DRAW_GRAPHS  # noqa: E402

    GRAPHS = True
except ImportError:
    GRAPHS = False


def together(rows, params, positions, graphs):
    return sample_rows(rows, params, positions, graphs) if graphs else sample_rows(rows, params, positions)


VOCAB = 154_880
CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature 1": SamplingParams(temperature=1.0, seed=1),
    "temperature 0.6": SamplingParams(temperature=0.6, seed=1),
    "temperature 1, top_p 0.95": SamplingParams(temperature=1.0, top_p=0.95, seed=1),
    "temperature 0.7, top_k 40": SamplingParams(temperature=0.7, top_k=40, seed=1),
    "temperature 0.6, top_p 0.95, top_k 20": SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=1),
    "temperature 1, min_p 0.05": SamplingParams(temperature=1.0, min_p=0.05, seed=1),
}


def rows(vocab: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    peaked = torch.randn(vocab, generator=gen) * 2.5 - 2.0
    top = torch.randperm(vocab, generator=gen)[:40]
    peaked[top] += torch.linspace(25.0, 8.0, 40)
    return {"peaked": peaked.to(device), "flat": (torch.randn(vocab, generator=gen) * 3.0).to(device)}


def timed(fn, calls: int) -> float:
    """Median ms of `calls` calls of fn(i), after 3 warm-up calls."""
    for i in range(3):
        fn(i)
    times = []
    for i in range(calls):
        start = time.perf_counter()
        fn(100 + i)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--device", default="cpu", help="where the rows are: cpu, or cuda")
    ap.add_argument(
        "--first-form", action="store_true", help="also time session 40's first graphed form (float64 sort, one scan)"
    )
    ap.add_argument("--profile", action="store_true", help="torch.profiler's table of 16 flat rows drawn together")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, dict] = {}
    on_gpu = args.device.startswith("cuda")
    if on_gpu:
        torch.cuda.empty_cache()
        held = torch.cuda.memory_reserved()
    for kind, row in rows(args.vocab, args.device).items():
        for name, params in CASES.items():
            ms = timed(lambda i: sample(row, params, i), args.calls)  # noqa: B023 (called before the next turn)
            results.setdefault(kind, {})[name] = round(ms, 3)
            print(f"{kind:7s} {name:40s} {ms:8.3f} ms", flush=True)
        ms = timed(lambda i: token_logprobs(row, i, 5), args.calls)  # noqa: B023
        results[kind]["token_logprobs, top 5"] = round(ms, 3)
        print(f"{kind:7s} {'token_logprobs, top 5':40s} {ms:8.3f} ms", flush=True)
        if sample_rows is not None and not row.is_cpu:  # a step's rows together (the host takes a row at a time)
            for count in (1, 4, 16):
                step = row.expand(count, -1)
                for name, params in CASES.items():
                    each = [params] * count
                    for graphs in (False, True) if GRAPHS else (False,):
                        ms = timed(lambda i: together(step, each, list(range(i, i + count)), graphs), args.calls)  # noqa: B023
                        label = f"{name}, a row of {count} together" + (", graphed" if graphs else "")
                        results[kind][label] = round(ms / count, 3)
                        print(f"{kind:7s} {label:50s} {ms / count:8.3f} ms", flush=True)
        if rows_logprobs is None:
            continue
        block = row.expand(DEVICE_ROWS, -1)  # a prompt's rows (completions' echo): ms a row
        ms = timed(lambda i: rows_logprobs(block, [i] * DEVICE_ROWS, 5), max(3, args.calls // 8)) / DEVICE_ROWS  # noqa: B023
        results[kind][f"rows_logprobs, top 5, a row of {DEVICE_ROWS}"] = round(ms, 3)
        print(f"{kind:7s} {f'rows_logprobs, top 5, a row of {DEVICE_ROWS}':40s} {ms:8.3f} ms", flush=True)
    if on_gpu and GRAPHS and args.first_form:
        results["first form"] = first_form(rows(args.vocab, args.device)["peaked"], args.calls)
    table = profiled(rows(args.vocab, args.device)["flat"]) if args.profile and sample_rows is not None else None
    if on_gpu and GRAPHS:  # what the graphs hold once the eager passes' cached blocks are given back
        torch.cuda.empty_cache()
        results["graphs"] = {
            "count": len(DRAW_GRAPHS),
            "MiB held": round((torch.cuda.memory_reserved() - held) / 2**20),
        }
        print(f"graphs: {results['graphs']}", flush=True)
    meta = {
        "vocab": args.vocab,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "calls": args.calls,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "engine": ENGINE or "this checkout",
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "ms_per_row": results, "profile": table}, f, indent=1)


def first_form(row: torch.Tensor, calls: int) -> dict[str, float]:
    """ms a row of 1, 4 and 16 rows graphed in session 40's first form, patched in on fresh graphs: the filters'
    ranking sorted on the float64 scores (not the fp32 logits that rank the same) and the running sums in one
    torch scan (not in blocks), against the same cases in the form of now, in turn."""
    import engine.sampling as s

    saved = s._filtered_picks, s._running_sums, s.DRAW_GRAPHS
    now = s.DRAW_GRAPHS

    def old_cut(scaled, gumbels, top_k, min_p, top_p, keys=None):
        return saved[0](scaled, gumbels, top_k, min_p, top_p, None)

    out: dict[str, float] = {}
    old = s.DrawGraphs()
    for count in (1, 4, 16):
        step = row.expand(count, -1)
        for name in ("temperature 1", "temperature 1, top_p 0.95"):
            each = [CASES[name]] * count
            for form in ("first form", "now"):
                if form == "first form":
                    s._filtered_picks, s._running_sums, s.DRAW_GRAPHS = old_cut, _one_scan, old
                try:
                    ms = timed(lambda i: sample_rows(step, each, list(range(i, i + count)), True), calls) / count  # noqa: B023
                finally:
                    s._filtered_picks, s._running_sums, s.DRAW_GRAPHS = saved[0], saved[1], now
                out[f"{name}, a row of {count} together, graphed, {form}"] = round(ms, 3)
                print(f"peaked  {name}, a row of {count}, graphed, {form:10s} {ms:8.3f} ms", flush=True)
    return out


def _one_scan(values: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(values, dim=1)


def profiled(row: torch.Tensor, count: int = 16) -> str:
    """torch.profiler's table (by device time; host time on the CPU) of 3 calls of `count` rows drawn together at
    temperature 1 and top_p 0.95: where a call's time goes."""
    from torch.profiler import ProfilerActivity, profile

    step, each = row.expand(count, -1), [CASES["temperature 1, top_p 0.95"]] * count
    sample_rows(step, each, list(range(count)))  # warm
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if not row.is_cpu else [])
    with profile(activities=activities) as prof:
        for i in range(3):
            sample_rows(step, each, list(range(i, i + count)))
    sort_by = "cpu_time_total" if row.is_cpu else "cuda_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=18)
    print(table)
    return table


if __name__ == "__main__":
    main()
