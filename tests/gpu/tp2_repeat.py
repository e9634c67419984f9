"""Run the TP=2 NCCL worker of test_nccl_tp2_equals_tp1 (tests/engine/tp_worker.py, two GPUs) several times and say
how long each run took, to catch an intermittent hang; a rank that outlives --timeout gets SIGABRT, and its Python
stacks (faulthandler) go to stderr.

    PYTHONPATH=.:tests/engine:tests python tests/gpu/tp2_repeat.py --runs 4 --timeout 60
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from reference import make_reference
from test_tensor_parallel import run_ranks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp, "ckpt")
        make_reference(checkpoint, "kda3_dsa1", seed=2)
        for run in range(args.runs):
            started = time.monotonic()
            try:
                ranks = run_ranks(checkpoint, 2, Path(tmp), device="cuda", timeout_s=args.timeout)
                verdict = "ok" if ranks[0]["tokens"] == ranks[1]["tokens"] else "ranks differ"
            except AssertionError as exc:
                verdict = f"FAILED: {exc}"
            print(f"run {run + 1}/{args.runs}: {time.monotonic() - started:.1f} s, {verdict}", flush=True)


if __name__ == "__main__":
    main()
