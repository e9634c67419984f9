"""Decode through the server's own loop on a GPU: the full-width GLM-5.3-Flash config at reduced depth (random bf16
weights, as bench/gpu_engine.py builds it; 154,880 tokens), the Scheduler and StepExecutor with CUDA graphs and
lanes (the HTTP layer left out). What bench/gpu_engine.py's step figures leave out is here: sampling every row,
delivering each token, the plan of each step.

For each sampling case and lane count, `--lanes` requests of a short prompt decode `--tokens` tokens at once; the
figure is tokens a second from the first token to the last, ms a step, and the host ms a step the scheduler spends
in `_apply` (sampling and delivering the step's rows); each form runs --repeats times, in turn, the best kept. `--host-sampling` adds, in the same
process, the same runs with each decode step's logits copied to the host before rank 0 samples them (the serving
path before session 38), and `--row-at-a-time` the runs with each row sampled alone on the GPU (session 38's path:
a host read a row, and top_p's ranking a row), and `--eager-draws` the rows together drawn eagerly (session 39's
path: ~40 launches a pass, where the default replays the pass's CUDA graph), so the forms are timed on one machine in
turn. `--logprobs N` adds requests that ask for N alternatives (greedy and top_p), their drawn rows'
log-probabilities made together (`Scheduler._draw_logprobs`) and, in turn, a row at a time (session 39's path).

    python bench/served_decode_bench.py [--layers KKKD] [--lanes 1,4] [--tokens 96] [--host-sampling]
        [--row-at-a-time] [--eager-draws] [--logprobs N] [--out F]
    python bench/served_decode_bench.py --device cpu --config engine/checkpoint/trained_demo/config.json --tokens 8
        # the path on the CPU, small (a check that it runs: no figure of the GPU)
"""

from __future__ import annotations

import argparse
import json
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
CASES = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.6, top_p 0.95": SamplingParams(temperature=0.6, top_p=0.95),
}


class Stream:
    """A request's sink: the times of its first and last tokens, its count, its end."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.tokens = 0
        self.end: object = None
        self.done = threading.Event()

    def __call__(self, event: object) -> None:
        if isinstance(event, Token):
            self.last = time.perf_counter()
            self.first = self.first or self.last
            self.tokens += 1
        else:
            self.end = event
            self.done.set()


def decode(sched: Scheduler, lanes: int, params: SamplingParams, tokens: int, tag: str, logprobs=None) -> dict:
    params = SamplingParams(**{**params.__dict__, "max_tokens": tokens, "seed": 1})
    streams = [Stream() for _ in range(lanes)]
    steps = sched.totals["steps"]
    for i, stream in enumerate(streams):
        sched.submit(Request(f"{tag}-{i}", [11 + i, 12, 13, 14], params, stream, frozenset(), logprobs=logprobs))
    for stream in streams:
        if not stream.done.wait(900):
            raise RuntimeError(f"{tag} did not finish")
        if not isinstance(stream.end, Finished):
            raise RuntimeError(f"{tag}: {stream.end}")
    start = min(s.first for s in streams if s.first is not None)
    end = max(s.last for s in streams)
    produced = sum(s.tokens for s in streams) - lanes  # the first tokens come from the prefills
    decode_steps = sched.totals["steps"] - steps - lanes
    return {
        "tok_s": round(produced / (end - start), 1),
        "ms_per_step": round(1e3 * (end - start) / max(decode_steps, 1), 3),
        "steps": decode_steps,
    }


class Applied:
    """The scheduler's `_apply` (sampling and delivering a step's rows, on its thread) timed: host ms a call."""

    def __init__(self, sched: Scheduler) -> None:
        self.apply, self.seconds, self.calls = sched._apply, 0.0, 0
        sched._apply = self  # type: ignore[method-assign]

    def __call__(self, work, logits) -> None:
        start = time.perf_counter()
        try:
            self.apply(work, logits)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def take(self) -> float:
        ms = 1e3 * self.seconds / max(self.calls, 1)
        self.seconds, self.calls = 0.0, 0
        return round(ms, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="KKKD")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", type=Path, default=CONFIG, help="the model config (default: GLM-5.3-Flash's)")
    ap.add_argument("--lanes", default="1,4")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--host-sampling", action="store_true", help="also time the rows copied to the host first")
    ap.add_argument("--row-at-a-time", action="store_true", help="also time each row sampled alone on the GPU")
    ap.add_argument("--eager-draws", action="store_true", help="also time the rows together drawn eagerly")
    ap.add_argument(
        "--logprobs",
        type=int,
        help="also time requests asking for this many alternatives, with the "
        "drawn rows' log-probabilities made together and, in turn, a row at a time (session 39's)",
    )
    ap.add_argument("--repeats", type=int, default=2, help="runs of each form, in turn; the best is kept")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, _ = build(args.layers, args.device, args.config)
    lane_counts = [int(n) for n in args.lanes.split(",")]
    executor = StepExecutor(model, model.make_pool(1 << 16, "bf16"), lanes=max(lane_counts), graphs=True)
    group = ParallelGroup.single(args.device)
    sched = Scheduler(executor, group, parallel=max(lane_counts), max_queued=64, prefill_chunk=2048)
    sched.start()
    served, together = executor._decode, sched._draw
    graphed = sched._graph_draws
    forms = {"GPU, rows together": (served, together, graphed)}
    if args.eager_draws:
        forms["GPU, rows eager"] = (served, together, False)  # session 39's path: the passes launched op by op
    if args.row_at_a_time:
        forms["GPU, a row at a time"] = (served, lambda reqs, logits: {}, False)  # session 38's: `_sample` a row
    if args.host_sampling:
        forms["host"] = (lambda plan: served(plan).cpu(), together, False)  # the serving path before session 38
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    results: dict = {"meta": {"layers": args.layers, "tokens": args.tokens, "device": gpu, "config": str(args.config)}}
    results["meta"]["graphed_draws"] = graphed
    try:
        decode(sched, max(lane_counts), CASES["greedy"], 8, "warm")  # graphs captured, kernels compiled
        applied = Applied(sched)
        cases = {name: (params, None, forms) for name, params in CASES.items()}
        if args.logprobs is not None:
            together_lps = sched._draw_logprobs
            alone_lps = {"GPU, logprobs a row at a time": (served, together, graphed)}
            plain = {"GPU, rows together": forms["GPU, rows together"]}
            for name in ("greedy", "temperature 0.6, top_p 0.95"):
                cases[f"{name}, logprobs {args.logprobs}"] = (CASES[name], args.logprobs, {**plain, **alone_lps})
        for lanes in lane_counts:
            for name, (params, logprobs, case_forms) in cases.items():
                best: dict[str, dict] = {}
                for turn in range(args.repeats):  # the forms in turn, so a slow first run shows as one
                    for form, (run, draw, graphs) in case_forms.items():
                        executor._decode, sched._draw = run, draw  # type: ignore[method-assign]
                        sched.draws_graphed = graphs
                        if args.logprobs is not None:  # session 39's: each drawn row's log-probabilities alone
                            alone = form == "GPU, logprobs a row at a time"
                            sched._draw_logprobs = (  # type: ignore[method-assign]
                                (lambda reqs, spans, rows, tokens: [None] * len(spans)) if alone else together_lps
                            )
                        applied.take()
                        got = decode(sched, lanes, params, args.tokens, f"{lanes}-{name}-{form}-{turn}", logprobs)
                        got["apply_ms"] = applied.take()  # host ms a step in `_apply`, sampling included
                        if form not in best or got["tok_s"] > best[form]["tok_s"]:
                            best[form] = got
                for form, got in best.items():
                    results[f"{lanes} lanes, {name}, sampled: {form}"] = got
                    print(
                        f"{lanes} lanes  {name:42s} {form:30s} {got['tok_s']:8.1f} tok/s  {got['ms_per_step']:7.3f} ms"
                        f" a step  {got['apply_ms']:7.3f} ms in _apply"
                    )
                if args.out:
                    Path(args.out).write_text(json.dumps(results, indent=1))
    finally:
        executor._decode, sched._draw = served, together  # type: ignore[method-assign]
        sched.draws_graphed = True
        sched.__dict__.pop("_draw_logprobs", None)
        sched.stop()


if __name__ == "__main__":
    main()
