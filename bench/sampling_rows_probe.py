"""Where a decode step's rows sampled together (`sample_rows`) spend their time on a GPU, by the rows' kind: distinct
normal rows, the same rounded to bf16 (a bf16 model's logits: many equal scores), one row repeated. Median ms a call
of 16 rows, and torch.profiler's table for the bf16 rows.

    python bench/sampling_rows_probe.py [--rows 16] [--out F]
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
from engine.sampling import SamplingParams, sample_rows  # noqa: E402

VOCAB = 154_880
CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature 1": SamplingParams(temperature=1.0, seed=1),
    "temperature 0.6, top_p 0.95": SamplingParams(temperature=0.6, top_p=0.95, seed=1),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--out")
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    distinct = torch.randn(args.rows, VOCAB, generator=gen) * 3.0
    kinds = {
        "distinct": distinct.cuda(),
        "bf16": distinct.to(torch.bfloat16).float().cuda(),
        "repeated": distinct[:1].expand(args.rows, -1).cuda(),
    }
    results: dict = {}
    for kind, rows in kinds.items():
        for name, params in CASES.items():
            each = [params] * args.rows
            times = []
            for i in range(13):
                torch.cuda.synchronize()
                start = time.perf_counter()
                sample_rows(rows, each, list(range(i, i + args.rows)))
                times.append(1e3 * (time.perf_counter() - start))
            ms = statistics.median(times[3:])
            results[f"{kind}, {name}"] = round(ms, 3)
            print(f"{kind:9s} {name:30s} {ms:8.3f} ms a call of {args.rows}", flush=True)
    from torch.profiler import ProfilerActivity, profile

    rows, each = kinds["bf16"], [CASES["temperature 0.6, top_p 0.95"]] * args.rows
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            sample_rows(rows, each, list(range(i, i + args.rows)))
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18)
    print(table)
    if args.out:
        Path(args.out).write_text(json.dumps({"ms_a_call": results, "profile": table}, indent=1))


if __name__ == "__main__":
    main()
