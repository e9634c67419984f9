"""Prompt reuse on the GPU: the full-width GLM-5.3-Flash config at reduced depth (random bf16 weights, as
bench/gpu_engine.py builds it), through the server's scheduler and executor (CUDA graphs, lanes, kept states; the
HTTP layer left out). Time to first token:

- "resent": a prompt of each size sent cold without keeping states (`reuse=False`), cold keeping them (the first
  send with PROMPT_REUSE on: what keeping costs), then sent again (resumed from its end: no prefill);
- "system": a conversation under a system prompt of each size, then a new conversation under the same one
  (resumed from the chunk boundary before the new user message).

Each figure for each prefill chunk size of --chunks (the model is built once).

Each resumed reply's 16 greedy token ids are checked against the cold reply's. Also: one KDA snapshot's bytes and
what keeping one costs. Writes JSON (--out) after every figure.

    python bench/reuse_bench.py [--layers KKKD] [--sizes 8192,32768] [--system 8192] [--chunks 2048,128] [--out F]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_engine import build  # noqa: E402

from engine.parallel import ParallelGroup  # noqa: E402
from engine.runner.executor import StepExecutor  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.scheduler import Finished, Request, Scheduler, Token  # noqa: E402

CONFIG = ROOT / "engine" / "checkpoint" / "glm53_flash_config.json"
MARK = 7  # the role token of these random prompts: a state is kept at the boundary before it


class Timed:
    """A request's sink: the time of its first token, its tokens, its end."""

    def __init__(self) -> None:
        self.sent = time.perf_counter()
        self.first: float | None = None
        self.tokens: list[int] = []
        self.end: object = None
        self.done = threading.Event()

    def __call__(self, event: object) -> None:
        if isinstance(event, Token):
            self.first = self.first or time.perf_counter()
            self.tokens.append(event.id)
        else:  # Finished or Failed (no prompt logprobs are asked for)
            self.end = event
            self.done.set()


def send(sched: Scheduler, ids: list[int], reuse: bool, tag: str) -> dict:
    sink = Timed()
    sched.submit(Request(tag, ids, SamplingParams(temperature=0.0, max_tokens=16), sink, reuse=reuse))
    if not sink.done.wait(900):
        raise RuntimeError(f"{tag} did not finish")
    if not isinstance(sink.end, Finished):
        raise RuntimeError(f"{tag}: {sink.end}")
    assert sink.first is not None
    return {"ttft_s": sink.first - sink.sent, "cached": sink.end.cached_tokens, "tokens": sink.tokens}


def words(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(10, vocab - 10) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="KKKD")
    ap.add_argument("--sizes", default="8192,32768")
    ap.add_argument("--system", default="8192")
    ap.add_argument("--chunks", default="2048,128")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out = Path(args.out) if args.out else None
    result: dict = {"layers": args.layers, "device": torch.cuda.get_device_name(0), "runs": []}

    def save() -> None:
        if out is not None:
            out.write_text(json.dumps(result, indent=1))

    model, cfg = build(args.layers, "cuda", CONFIG)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    systems = [int(s) for s in args.system.split(",") if s]
    pool_tokens = 2 * max(sizes + systems) + 4096
    for chunk in (int(c) for c in args.chunks.split(",")):
        run: dict = {"chunk": chunk}
        result["runs"].append(run)
        executor = StepExecutor(model, model.make_pool(pool_tokens, "bf16"), lanes=2, graphs=True)
        sched = Scheduler(
            executor,
            ParallelGroup.single("cuda"),
            parallel=2,
            max_queued=8,
            prefill_chunk=chunk,
            reuse_bytes=4 << 30,
            reuse_marks=frozenset({MARK}),
        )
        assert sched.index is not None
        run["snapshot_bytes"] = sched.index.snapshot_bytes
        sched.start()
        rng = random.Random(chunk)
        try:
            send(sched, words(rng, 2 * chunk + 5, cfg.vocab_size), False, "warm-up")  # graphs, kernels
            measure(sched, run, rng, cfg.vocab_size, sizes, systems, save)
            run["prompt_reuse"] = sched.stats()["prompt_reuse"]
            save()
        finally:
            sched.stop()
        del executor, sched
        torch.cuda.empty_cache()


def measure(sched: Scheduler, run: dict, rng: random.Random, vocab: int, sizes, systems, save) -> None:
    rows = run.setdefault("resent", [])
    for n in sizes:
        ids = words(rng, n, vocab)
        plain = send(sched, ids, False, f"plain {n}")
        cold = send(sched, ids, True, f"cold {n}")
        again = send(sched, ids, True, f"again {n}")
        rows.append(
            {
                "prompt_tokens": n,
                "cold_ttft_s": round(plain["ttft_s"], 4),
                "cold_keeping_ttft_s": round(cold["ttft_s"], 4),
                "resent_ttft_s": round(again["ttft_s"], 4),
                "cached_tokens": again["cached"],
                "share": round(again["ttft_s"] / plain["ttft_s"], 4),
                "same_tokens": plain["tokens"] == cold["tokens"] == again["tokens"],
                "states": sched.stats()["prompt_reuse"]["states"],
            }
        )
        print(run["chunk"], json.dumps(rows[-1]), flush=True)
        save()
    rows = run.setdefault("system", [])
    for n in systems:
        system = words(rng, n, vocab)
        first = system + [MARK] + words(rng, 200, vocab)
        second = system + [MARK] + words(rng, 200, vocab)
        send(sched, first, True, f"system first {n}")
        plain = send(sched, second, False, f"system plain {n}")
        warm = send(sched, second, True, f"system warm {n}")
        rows.append(
            {
                "system_tokens": n,
                "prompt_tokens": len(second),
                "cold_ttft_s": round(plain["ttft_s"], 4),
                "warm_ttft_s": round(warm["ttft_s"], 4),
                "cached_tokens": warm["cached"],
                "share": round(warm["ttft_s"] / plain["ttft_s"], 4),
                "same_tokens": plain["tokens"] == warm["tokens"],
            }
        )
        print(run["chunk"], json.dumps(rows[-1]), flush=True)
        save()


if __name__ == "__main__":
    main()
