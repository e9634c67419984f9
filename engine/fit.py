"""`python -m engine fit CHECKPOINT --tp N --context C --kv K [--device auto|cpu|cuda] [--memory-reserve-gib R]`:
whether a window can ever fit this machine, from config.json and the safetensors headers (no weight is loaded).

The recipe asks before it stops a running server: the answer compares the ranks' weights plus one window of cache
per rank (the bytes per token the engine's pool uses) with this machine's TOTAL memory less the reserve — not with
what is free now, which the server about to be stopped still holds. A window refused here can never load; one that
passes may still be cut at load to what is free then (serve's `size_pool` names the window that fits). Every rank
is taken to run here (the embedded default); ranks on one memory (the CPU, or a GPU that several ranks share) add
up. Prints one JSON object; exit code 0 when the window fits, 3 when it never can, 2 when the checkpoint is unusable.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from engine.config import DENSE_MODES, DRAFTERS, KV_MODES, switch

GIB = 2**30
LARGEST = 1_048_576  # what serve's `size_pool` takes for --context 0 at most
LOAD_ITEM = {"cpu": 4, "cuda": 2}  # bytes per weight as loaded: fp32 on the CPU, bf16 on CUDA (model.load)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="checkpoint directory (config.json, safetensors)")
    p.add_argument("--tp", type=int, default=1, help="ranks in all, every one on this machine")
    p.add_argument("--context", type=int, default=8192, help="window per request; 0 = largest fit")
    p.add_argument("--kv", choices=KV_MODES, default="bf16", help="cached attention row type")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument(
        "--drafter",
        choices=DRAFTERS,
        default="none",
        help="as serve's: with mtp the MTP layer's pool rows count too",
    )
    p.add_argument(
        "--dense",
        choices=DENSE_MODES,
        default="bf16",
        help="as serve's: the dense weights counted as kept in this mode",
    )
    p.add_argument(
        "--memory-reserve-gib",
        type=float,
        default=None,
        help="memory left free for the system (default: 1 GiB on the CPU, 4 GiB on a GPU)",
    )
    p.add_argument("--vision", type=switch, default=False, help="as serve's: rank 0 holds the vision tower too (1/0)")


def rank_weight_bytes(
    directory: Path, config: dict[str, Any], tp: int, device: str, dense: str = "bf16", vision: bool = False
) -> list[int]:
    """At least what each rank's weights take once loaded (text tower and MTP; with `vision` the vision tower,
    whole, on rank 0): its TP share of every tensor, at the smaller of the stored and the loaded element size, or as
    kept with DENSE=`dense` (engine/quant/dense.py `kept_bytes`)."""
    from engine.checkpoint.info import checkpoint_tensors, is_vision, kept_share

    shares = [0] * tp
    for tensor in checkpoint_tensors(directory) or ():
        if is_vision(tensor.name):
            if vision:
                shares[0] += kept_share(tensor, config, 0, 1, "bf16", LOAD_ITEM[device])
            continue
        for rank in range(tp):
            shares[rank] += kept_share(tensor, config, rank, tp, dense, LOAD_ITEM[device])
    return shares


def memories(device: str, tp: int) -> list[tuple[int, list[int]]]:
    """(total bytes, the ranks on it) per memory the ranks use: the CPU's, or each GPU's as serve picks it."""
    if device == "cpu":
        return [(_mem_total(), list(range(tp)))]
    import torch

    count = torch.cuda.device_count()
    if count <= 1:
        return [(int(torch.cuda.mem_get_info(0)[1]), list(range(tp)))]
    return [
        (int(torch.cuda.mem_get_info(d)[1]), [r for r in range(tp) if r % count == d]) for d in range(min(count, tp))
    ]


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _reserve_bytes(args: argparse.Namespace, device: str) -> int:
    """The reserve exactly as serve's `size_pool` takes it (EngineConfig.reserve_gib)."""
    from engine.config import EngineConfig

    return int(EngineConfig(args.checkpoint, memory_reserve_gib=args.memory_reserve_gib).reserve_gib(device) * GIB)


def fit(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """The tightest memory's figures and the largest window it can ever hold."""
    from engine.models.glm5_next.config import TextConfig

    config = json.loads(Path(args.checkpoint, "config.json").read_text())
    from engine.models.glm5_next.model import cache_bytes_per_token

    per_token = cache_bytes_per_token(TextConfig.from_dict(config), args.kv, mtp="mtp" in args.drafter)
    weights = rank_weight_bytes(Path(args.checkpoint), config, args.tp, device, args.dense, args.vision)
    reserve = _reserve_bytes(args, device)
    answers = []
    for total, ranks in memories(device, args.tp):
        room = total - reserve - sum(weights[r] for r in ranks)
        largest = min(LARGEST, max(0, room) // (per_token * len(ranks)))
        answers.append(
            dict(
                memory_bytes=total,
                reserve_bytes=reserve,
                weights_bytes=sum(weights[r] for r in ranks),
                ranks_on_memory=len(ranks),
                largest_window=largest,
            )
        )
    tightest = min(answers, key=lambda a: a["largest_window"])
    fits = args.context <= tightest["largest_window"] if args.context > 0 else tightest["largest_window"] >= 1
    return dict(fits=fits, context=args.context, device=device, bytes_per_token=per_token, **tightest)


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run(args: argparse.Namespace) -> int:
    if args.tp < 1 or args.context < 0:
        print(json.dumps({"error": f"--tp {args.tp} / --context {args.context}: need --tp >= 1, --context >= 0"}))
        return 2
    try:
        answer = fit(args, _device(args.device))
    except (OSError, ValueError, KeyError, TypeError) as error:  # ConfigError is a ValueError
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
        return 2
    print(json.dumps(answer))
    return 0 if answer["fits"] else 3
