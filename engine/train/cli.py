"""`python -m engine train-demo OUT [--seed N] [--steps N]`: train the demo model on synthetic GLM-format
conversations and write it in the demo checkpoint layout (a dev-time step: it needs transformers)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

from engine.train.trainer import PRESET, TrainSettings

DEFAULTS = TrainSettings()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, help="where to write the trained checkpoint (created if missing)")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed, help="start weights, data order and examples")
    parser.add_argument("--steps", type=int, default=DEFAULTS.steps, help="optimizer steps")
    parser.add_argument(
        "--tokens-per-step",
        type=int,
        default=DEFAULTS.tokens_per_step,
        help="padded tokens per batch (short conversations come many to a batch)",
    )
    parser.add_argument("--lr", type=float, default=DEFAULTS.lr, help="peak learning rate (AdamW)")
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULTS.threads,
        help="torch threads; the weights hash is only stable for the same value",
    )
    parser.add_argument("--mtp-steps", type=int, default=DEFAULTS.mtp_steps, help="optimizer steps of the MTP layer")
    parser.add_argument("--every", type=int, default=25, help="print the loss every this many steps")


def run(args: argparse.Namespace) -> int:
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("train-demo needs transformers (a dev dependency): pip install -e '.[dev]'", file=sys.stderr)
        return 2
    from engine.train.export import weights_hash, write_trained
    from engine.train.trainer import train

    settings = TrainSettings(
        seed=args.seed,
        steps=args.steps,
        tokens_per_step=args.tokens_per_step,
        lr=args.lr,
        threads=args.threads,
        mtp_steps=args.mtp_steps,
    )
    window: list[float] = []

    def reporter(label: str, steps: int) -> Callable[[int, float], None]:
        def report(step: int, loss: float) -> None:
            window.append(loss)
            if (step + 1) % args.every == 0 or step + 1 == steps:
                print(f"{label}step {step + 1:>5}/{steps}  loss {sum(window) / len(window):.4f}", flush=True)
                window.clear()

        return report

    result = train(settings, reporter("", settings.steps), reporter("mtp ", settings.mtp_steps))
    out = write_trained(result.model, args.directory, seed=settings.seed, preset=PRESET, mtp=result.mtp)
    print(
        f"trained {settings.steps} steps ({result.tokens} padded tokens) and {settings.mtp_steps} MTP steps in "
        f"{result.seconds:.0f} s on {settings.threads} thread(s); final loss {result.losses[-1]:.4f}"
        + (f", MTP {result.mtp_losses[-1]:.4f}" if result.mtp_losses else "")
    )
    digest = weights_hash(out)
    record = dict(
        dataclasses.asdict(settings),
        seconds=round(result.seconds),
        tokens=result.tokens,
        final_loss=round(result.losses[-1], 4),
        final_mtp_loss=round(result.mtp_losses[-1], 4) if result.mtp_losses else None,
        weights_sha256=digest,
    )
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}; weights sha256 {digest}")
    return 0
