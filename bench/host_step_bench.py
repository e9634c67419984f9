"""Rank 0's host time a decode step at GLM-5.3-Flash's vocabulary, the model's own time taken out (CPU, no GPU).

The real Scheduler and StepExecutor run over a stand-in model — labelled as such: its decode returns prepared
logit rows of 154,880 tokens (language-model shaped: a bulk around -2, a few tokens raised 8–25 above it) and does
nothing else, so what is timed is the serving loop's own work a step: the plan, sampling each lane's row, the
token's delivery and the bookkeeping. On a GPU every row is sampled on the device (since session 38; a decode
step's rows together since session 39: bench/served_decode_bench.py times that); this bench times the host path,
which a CPU rank takes.

    python bench/host_step_bench.py --out bench/results/DATE-cpu-host_step.json
    python bench/host_step_bench.py --engine /tmp/old ...   # a git worktree's engine (bench/other_tree.py)
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch
from other_tree import from_argv

ENGINE = from_argv()  # --engine DIR: another checkout's engine (bench/other_tree.py)
from engine.parallel import ParallelGroup  # noqa: E402
from engine.runner.executor import StepExecutor  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.scheduler import Finished, Request, Scheduler, Token  # noqa: E402

VOCAB = 154_880
CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.6, top_p 0.95": SamplingParams(temperature=0.6, top_p=0.95),
}


class _Pool:
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = self.free_tokens = num_tokens


class _Sequence:
    def __init__(self, pool: _Pool) -> None:
        self.pool, self.length = pool, 0

    def release(self) -> None:
        self.pool.free_tokens += self.length


class StandInModel:
    """A stand-in for the model (see the module docstring): prepared rows, no computation."""

    def __init__(self, vocab: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.rows = torch.randn(16, vocab, generator=gen) * 2.5 - 2.0
        for i in range(16):
            self.rows[i, torch.randperm(vocab, generator=gen)[:40]] += torch.linspace(25.0, 8.0, 40)
        self.turn = 0

    def make_pool(self, num_tokens: int) -> _Pool:
        return _Pool(num_tokens)

    def new_sequence(self, pool: _Pool) -> _Sequence:
        return _Sequence(pool)

    def prefill(self, seq: _Sequence, ids: list[int]) -> torch.Tensor:
        seq.length += len(ids)
        return self.rows[0].clone()

    def decode(self, seqs: list[_Sequence], tokens: list[int]) -> torch.Tensor:
        for seq in seqs:
            seq.length += 1
        self.turn += 1
        return self.rows[[(self.turn + i) % 16 for i in range(len(seqs))]]


class _Sink:
    def __init__(self) -> None:
        self.tokens, self.done, self.end = 0, threading.Event(), None

    def __call__(self, event: object) -> None:
        if isinstance(event, Token):
            self.tokens += 1
        else:  # its end: Finished, or Failed (which the check after the run catches)
            self.done.set()
            self.end = event


def run(lanes: int, params: SamplingParams, tokens: int, vocab: int) -> dict[str, float]:
    """`lanes` requests of `tokens` tokens each at once; host ms a step (each request's one prefill step included)
    and a token."""
    model = StandInModel(vocab)
    executor = StepExecutor(model, model.make_pool(1 << 20), lanes=lanes)
    sched = Scheduler(executor, ParallelGroup.single(), parallel=lanes, max_queued=lanes, prefill_chunk=128)
    sched.start()
    try:
        params = SamplingParams(**{**params.__dict__, "max_tokens": tokens})
        sinks = [_Sink() for _ in range(lanes)]
        start = time.perf_counter()
        for i, sink in enumerate(sinks):
            sched.submit(Request(f"r{i}", [1, 2, 3], params, sink, frozenset()))
        assert all(sink.done.wait(600) for sink in sinks)
        wall = time.perf_counter() - start
        assert all(isinstance(sink.end, Finished) for sink in sinks), [sink.end for sink in sinks]
    finally:
        sched.stop()
    steps = sched.totals["steps"]
    produced = sum(sink.tokens for sink in sinks)
    return {
        "steps": steps,
        "tokens": produced,
        "ms_per_step": 1e3 * wall / steps,
        "ms_per_token": 1e3 * wall / produced,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=VOCAB)
    ap.add_argument("--tokens", type=int, default=64, help="tokens a request")
    ap.add_argument("--lanes", default="1,4")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for lanes in map(int, args.lanes.split(",")):
        for name, params in CASES.items():
            got = run(lanes, params, args.tokens, args.vocab)
            results[f"{lanes} lanes, {name}"] = got
            print(
                f"{lanes} lanes  {name:30s} {got['ms_per_step']:7.3f} ms a step  {got['ms_per_token']:7.3f} ms a token"
            )
    if args.out:
        meta = {"vocab": args.vocab, "tokens": args.tokens, "threads": args.threads, "torch": torch.__version__}
        meta["engine"] = ENGINE or "this checkout"
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
