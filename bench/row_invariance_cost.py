"""What exact drafting costs a GPU step: the full-width GLM-5.3-Flash config (bench/gpu_engine.py's random weights;
4 layers by default, or the released depth), CUDA graphs, with and without the row-invariant products
(`ops.require_row_invariance`), and which kind of padded call costs what.

    python bench/row_invariance_cost.py [--layers KKKD|released] [--exl3-experts] [--shard 2] [--dense q4]
                                        [--profile] [--out row_invariance.json]

Modes, each a fresh decoder (its own graphs), in this order:
- `off`: a decoder without verify windows, nothing padded (the drafts-off serving step);
- `window`: a decoder with verify windows (per-row states kept, MTP rows) but nothing padded;
- `only:KIND`: the same with one kind of `row_blocks` call padded (linear, norm, dsa_heads, dsa_attend);
- `on`: every kind padded: the step a decoder that may verify drafts serves with. (Session 17's first call also
  timed `on:copy-pad`, padding by one copy into an uninitialised block, since made `row_blocks`' own.)
Each times the plain step at batch 1 and 4 (lanes with their own prompts and tokens); `on` also a verify window of 4.
`off` and `on` then check the bits: lane 0's logits decoded alone against beside three lanes (`on`: 0.0), and the
rows of a verify window beside three lanes against the serial decode (`on`: 0.0 each). `--profile`: GPU time per
kernel name of the batch-1 plain step in `off` and `on` and of `on`'s batch-1 verify window (torch.profiler), and the
kernels a step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpu_engine import build, lane_inputs, profile_calls, prompt_ids, timed  # noqa: E402

from engine.ops import reference  # noqa: E402
from engine.runner.lanes import LaneDecoder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="KKKD")
    parser.add_argument("--exl3-experts", action="store_true", help="routed experts as random 4-bit EXL3 banks")
    parser.add_argument("--shard", type=int, default=1, help="rank 0's TP share of this many ranks, on this GPU")
    parser.add_argument("--dense", choices=("bf16", "q4", "fp8"), default="bf16", help="how dense weights are kept")
    parser.add_argument("--kinds", action="store_true", help="also time each kind of padded call alone")
    parser.add_argument("--profile", action="store_true", help="kernels of the batch-1 plain step, off and on")
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
    pool = model.make_pool(8192, "bf16")
    prompts, plain = lane_inputs(prompt_ids(cfg, 128 * 4), 4)

    def fresh(batch: int, window: int, kinds: tuple[str, ...]):
        decoder = LaneDecoder(model, pool, 4, graphs=True, window=window)
        reference.CUDA_ROW_BLOCKS.clear()  # what this mode pads: set before the decoder captures its graphs
        reference.CUDA_ROW_BLOCKS.update(kinds)
        seqs = [decoder.new_sequence(lane) for lane in range(batch)]
        for seq, prompt in zip(seqs, prompts):
            model.prefill(seq, prompt)
        return decoder, seqs

    def done(seqs) -> None:
        for seq in seqs:
            seq.release()

    every = reference.ROW_INVARIANT_KINDS
    modes: list[tuple[str, int, tuple[str, ...]]] = [("off", 1, ()), ("window", 5, ())]
    if args.kinds:
        modes += [(f"only:{kind}", 5, (kind,)) for kind in every]
    modes.append(("on", 5, every))
    result: dict = {"layers": args.layers, "exl3_experts": args.exl3_experts, "shard": args.shard, "dense": args.dense}
    with torch.no_grad():
        for mode, window, kinds in modes:
            figures: dict = {}
            for batch in (1, 4):
                decoder, seqs = fresh(batch, window, kinds)
                tokens = plain[:batch]
                decoder.decode(seqs, tokens)  # capture
                figures[f"decode_b{batch}_ms"] = round(timed(lambda: decoder.decode(seqs, tokens), 20) * 1e3, 3)
                if args.profile and batch == 1 and mode in ("off", "on"):
                    figures["profile_b1"] = profile_calls(lambda: decoder.decode(seqs, tokens), 5)
                if mode == "on":
                    windows = [[token + 7 * t for t in range(4)] for token in tokens]
                    decoder.verify(seqs, windows)  # capture
                    step = timed(lambda: decoder.verify(seqs, windows), 20)
                    figures[f"verify4_b{batch}_ms"] = round(step * 1e3, 3)
                    if args.profile and batch == 1 and mode == "on":
                        figures["profile_verify4_b1"] = profile_calls(lambda: decoder.verify(seqs, windows), 5)
                done(seqs)
            if mode in ("off", "on"):
                figures.update(bits(fresh, done, window, kinds, mode == "on"))
            figures["graphs"] = decoder.uses_graphs
            result[mode] = figures
            print(mode, {k: v for k, v in figures.items() if not k.startswith("profile")}, flush=True)
            if args.out:  # after every mode: a run cut short keeps what it measured
                Path(args.out).write_text(json.dumps(result, indent=1))


def bits(fresh, done, window: int, kinds: tuple[str, ...], verify: bool) -> dict:
    """Lane 0's logits beside three lanes against alone; with `verify`, a window's rows against the serial decode."""
    tokens = [11, 12, 13, 14]
    decoder, seqs = fresh(1, window, kinds)
    serial = [decoder.decode([seqs[0]], [t])[0] for t in tokens]
    done(seqs)
    decoder, seqs = fresh(4, window, kinds)
    beside = decoder.decode(seqs, [11, 20, 21, 22])[0]
    done(seqs)
    out = {"diff_beside": float((beside - serial[0]).abs().max())}
    if verify:
        decoder, seqs = fresh(4, window, kinds)
        rows = decoder.verify(seqs, [tokens, [20, 21], [22], [23, 24, 25]])[0]
        done(seqs)
        out["diff_verify_rows"] = [float((rows[t] - serial[t]).abs().max()) for t in range(4)]
    return out


if __name__ == "__main__":
    main()
