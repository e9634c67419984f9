"""Drafts on the CPU, through the scheduler (the server's path minus HTTP), on the committed trained demo.

    python bench/drafts_cpu.py [--drafters copy,mtp,mtp+copy] [--out drafts_cpu.json]

For two prompt sets — prose (the demo's own chat kinds: answers, tool calls, thinking) and copy-heavy (a list to
repeat) — one request at a time, greedy, 64 tokens: wall time and decode steps with each drafter (3 drafts a step)
and with "draft": false, tokens committed per lane window, acceptance (by drafter too). The replies are checked
equal (they must be).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tokenizers import Tokenizer  # noqa: E402

from engine.checkpoint.demo import TRAINED  # noqa: E402
from engine.models.glm5_next.model import Glm5NextForCausalLM  # noqa: E402
from engine.parallel import ParallelGroup  # noqa: E402
from engine.runner.executor import StepExecutor  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.scheduler import Request, Scheduler  # noqa: E402
from engine.train import synthetic  # noqa: E402

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def prompt_sets(tokenizer: Tokenizer) -> dict[str, list[list[int]]]:
    prose = [tokenizer.encode(synthetic.prompt(e)).ids for e in synthetic.examples("eval", 11, 8)]
    copy = []
    for i in range(8):
        listing = " ".join(WORDS[i:] + WORDS[:i])
        text = f"<|user|>repeat: {listing}. again: {listing}. and once more: {listing}<|assistant|></think>"
        copy.append(tokenizer.encode(text).ids)
    return {"prose": prose, "copy_heavy": copy}


def run(model, eos, prompts, draft: bool, drafter: str = "copy") -> tuple[list[list[int]], float, dict]:
    executor = StepExecutor(model, model.make_pool(4096, "fp32"), lanes=1, graphs=False, window=4)
    sched = Scheduler(
        executor, ParallelGroup.single(), parallel=1, max_queued=len(prompts), drafter=drafter, draft_tokens=3
    )
    sched.start()
    outputs = []
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        done, tokens = [], []

        def sink(event, tokens=tokens, done=done):
            if hasattr(event, "id"):
                tokens.append(event.id)
            else:
                done.append(event)

        sched.submit(Request(f"r{i}", ids, SamplingParams(temperature=0.0, max_tokens=64), sink, eos, draft=draft))
        while not done:
            time.sleep(0.002)
        outputs.append(tokens)
    seconds = time.perf_counter() - start
    stats = sched.stats()["drafts"]
    sched.stop()
    return outputs, seconds, stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--drafters", default="copy,mtp,mtp+copy")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = Glm5NextForCausalLM.load(TRAINED, mtp=True)
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    eos = frozenset(json.loads((TRAINED / "config.json").read_text())["text_config"]["eos_token_id"])
    result: dict = {}
    for name, prompts in prompt_sets(tokenizer).items():
        serial, t_serial, _ = run(model, eos, prompts, draft=False)
        result[name] = {"requests": len(prompts), "tokens": sum(len(t) for t in serial), "serial_s": round(t_serial, 3)}
        for drafter in args.drafters.split(","):
            drafted, t_drafted, stats = run(model, eos, prompts, True, drafter)
            assert serial == drafted, f"{name}, {drafter}: drafted replies differ from serial ones"
            result[name][drafter] = {
                "drafted_s": round(t_drafted, 3),
                "speedup": round(t_serial / t_drafted, 2),
                "tokens_per_step": round(stats["committed"] / stats["windows"], 2),
                "acceptance": round(stats["accepted"] / stats["drafted"], 3) if stats["drafted"] else None,
                "drafted": stats["drafted"],
                "accepted": stats["accepted"],
                "by_drafter": stats["by_drafter"],
            }
            print(name, drafter, result[name][drafter], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
