"""What exact drafting costs a GPU step: the full-width GLM-5.3-Flash config at 4 layers (bench/gpu_engine.py's
random bf16 weights), CUDA graphs, with and without the row-invariant products (`ops.require_row_invariance`).

    python bench/row_invariance_cost.py [--out row_invariance.json]

First without (decoders without verify windows, which leave the products as they are): the decode step at batch 1
and 4, and lane 0's logits decoded alone against beside three lanes (max |diff|). Then with (decoders that verify
drafts turn it on for the process): the same, a verify window of 4 at batch 1 and 4, and the rows of a verify window
beside three lanes against the serial decode.
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
from gpu_engine import build, prompt_ids, timed  # noqa: E402

from engine.ops import reference  # noqa: E402
from engine.runner.lanes import LaneDecoder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model, cfg = build("KKKD", "cuda", ROOT / "engine/checkpoint/glm53_flash_config.json")
    pool = model.make_pool(8192, "bf16")
    ids = prompt_ids(cfg, 128)

    def fresh(batch: int, window: int):
        decoder = LaneDecoder(model, pool, 4, graphs=True, window=window)
        seqs = [decoder.new_sequence(lane) for lane in range(batch)]
        for i, seq in enumerate(seqs):
            model.prefill(seq, ids[i:] + ids[:i])
        return decoder, seqs

    def done(seqs) -> None:
        for seq in seqs:
            seq.release()

    result = {}
    for mode in ("off", "on"):  # in this order: a decoder with verify windows turns row invariance on for good
        window = 5 if mode == "on" else 1
        figures: dict = {}
        with torch.no_grad():
            for batch in (1, 4):
                decoder, seqs = fresh(batch, window)
                plain = [11] * batch
                decoder.decode(seqs, plain)
                figures[f"decode_b{batch}_ms"] = round(timed(lambda: decoder.decode(seqs, plain), 20) * 1e3, 3)
                if mode == "on":
                    windows = [[11, 12, 13, 14]] * batch
                    decoder.verify(seqs, windows)
                    step = timed(lambda: decoder.verify(seqs, windows), 20)
                    figures[f"verify4_b{batch}_ms"] = round(step * 1e3, 3)
                done(seqs)
            tokens = [11, 12, 13, 14]
            decoder, seqs = fresh(1, window)
            serial = [decoder.decode([seqs[0]], [t])[0] for t in tokens]
            done(seqs)
            decoder, seqs = fresh(4, window)
            beside = decoder.decode(seqs, [11, 20, 21, 22])[0]
            done(seqs)
            if mode == "on":
                decoder, seqs = fresh(4, window)
                rows = decoder.verify(seqs, [tokens, [20, 21], [22], [23, 24, 25]])[0]
                done(seqs)
                figures["diff_verify_rows"] = [float((rows[t] - serial[t]).abs().max()) for t in range(4)]
        figures["diff_beside"] = float((beside - serial[0]).abs().max())
        figures["row_invariant"] = bool(reference.CUDA_ROW_BLOCKS)
        figures["graphs"] = decoder.uses_graphs
        result[f"row_invariance_{mode}"] = figures
        print(mode, figures, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
