"""Decode and prefill speed of our engine on one checkpoint, one rank (a baseline, not a timed test).

    python bench/engine_decode.py CHECKPOINT [--device cpu|cuda] [--prompt 200] [--tokens 32]
Prints prefill tok/s and decode tok/s at batch 1..4 (aggregate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.models.glm5_next.model import Glm5NextForCausalLM  # noqa: E402
from engine.parallel import ParallelGroup  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompt", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    model = Glm5NextForCausalLM.load(args.checkpoint, ParallelGroup.single(args.device))
    pool = model.make_pool(8 * (args.prompt + args.tokens + 8))
    ids = [(i * 7919) % (model.cfg.vocab_size - 10) + 5 for i in range(args.prompt)]
    result = {"device": args.device, "prompt": args.prompt}
    model.prefill(model.new_sequence(pool), ids[:16])  # warm-up
    sync(args.device)
    start = time.perf_counter()
    model.prefill(model.new_sequence(pool), ids)
    sync(args.device)
    result["prefill_tok_s"] = round(args.prompt / (time.perf_counter() - start), 1)
    for batch in (1, 2, 3, 4):
        seqs = [model.new_sequence(pool) for _ in range(batch)]
        nxt = [int(model.prefill(s, ids[: 50 + 10 * i]).argmax()) for i, s in enumerate(seqs)]
        sync(args.device)
        start = time.perf_counter()
        for _ in range(args.tokens):
            nxt = model.decode(seqs, nxt).argmax(-1).tolist()
        sync(args.device)
        result[f"decode_b{batch}_tok_s"] = round(batch * args.tokens / (time.perf_counter() - start), 1)
        for s in seqs:
            s.release()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
