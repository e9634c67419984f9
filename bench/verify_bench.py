"""Verify-window step times on the GPU: the full-width GLM-5.3-Flash config at reduced depth (bench/gpu_engine.py's
random bf16 weights), replayed from CUDA graphs.

    python bench/verify_bench.py [--layers KKKD|released] [--mtp] [--exl3-experts] [--shard 2] [--dense q4]
                                 [--out verify.json]

For batch 1 and 4 (after a 128-token prompt per lane): the plain decode step (one token a lane) and verify steps of
windows 2..5 (the pending token and 1..4 drafts a lane). A verify step's cost against the plain step is what a
draft must win back: with acceptance a, a window of w commits 1 + (accepted drafts) tokens for one step.

`--mtp`: the model has its MTP layer (full width, random weights), and each verify step drafts with it first — the
layer absorbs the lane's committed token (one a step here) and chains w-2 more rows — so the figure is the whole
cost of an MTP-drafted step; `mtp_only_ms` is the MTP part alone (absorb + chain, its own graph).
`--layers released --exl3-experts --shard 2`: the served model at its real depth, rank 0's TP=2 share on this GPU
(gpu_engine.py's `build`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_engine import build, lane_inputs, prompt_ids, timed  # noqa: E402

from engine.runner.lanes import LaneDecoder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="KKKD")
    parser.add_argument("--out", default=None)
    parser.add_argument("--mtp", action="store_true", help="draft with the MTP layer in every verify step")
    parser.add_argument("--exl3-experts", action="store_true", help="routed experts as random 4-bit EXL3 banks")
    parser.add_argument("--shard", type=int, default=1, help="rank 0's TP share of this many ranks, on this GPU")
    parser.add_argument("--dense", choices=("bf16", "q4", "fp8"), default="bf16", help="how dense weights are kept")
    parser.add_argument("--config", default=str(ROOT / "engine/checkpoint/glm53_flash_config.json"))
    args = parser.parse_args()
    model, cfg = build(
        args.layers,
        "cuda",
        Path(args.config),
        mtp=args.mtp,
        exl3_experts=args.exl3_experts,
        shard=args.shard,
        dense=args.dense,
    )
    pool = model.make_pool(8192, "bf16")
    decoder = LaneDecoder(model, pool, 4, graphs=True, window=5)
    ids = prompt_ids(cfg, 128 * 4)
    result: dict = {
        "layers": args.layers,
        "graphs": True,
        "mtp": args.mtp,
        "exl3_experts": args.exl3_experts,
        "shard": args.shard,
        "dense": args.dense,
    }
    for batch in (1, 4):
        seqs = [decoder.new_sequence(lane) for lane in range(batch)]
        prompts, plain = lane_inputs(ids, batch)  # lanes that differ, so they route to different experts
        for seq, prompt in zip(seqs, prompts):
            model.prefill(seq, prompt)
        decoder.decode(seqs, plain)  # capture
        base = timed(lambda: decoder.decode(seqs, plain), 20)
        figures = {"plain_ms": round(base * 1e3, 3)}
        for width in range(2, 6):
            if args.mtp:
                windows = [[token, *([-1] * (width - 1))] for token in plain]
                absorb = [[token] for token in plain]
                decoder.verify(seqs, windows, absorb)  # capture
                step = timed(lambda: decoder.verify(seqs, windows, absorb), 20)
                drafts_only = timed(lambda: decoder._draft(seqs, windows, absorb), 20)
                figures[f"window{width}_mtp_only_ms"] = round(drafts_only * 1e3, 3)
            else:
                windows = [[token + t for t in range(width)] for token in plain]
                decoder.verify(seqs, windows)  # capture
                step = timed(lambda: decoder.verify(seqs, windows), 20)
            figures[f"window{width}_ms"] = round(step * 1e3, 3)
            figures[f"window{width}_vs_plain"] = round(step / base, 2)
        for seq in seqs:
            seq.release()
        result[f"batch{batch}"] = figures
        result["uses_graphs"] = decoder.uses_graphs
        print(f"batch {batch}: {figures}", flush=True)
        if args.out:  # after every batch: a run cut short keeps what it measured
            Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
