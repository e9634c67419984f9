"""The reduced-precision dense products (engine/ops/triton_dense.py) on GLM-5.3-Flash's dense weight shapes, on the
GPU: time per call at 1, 2, 4, 8 (and 16, 64) rows for q4 and fp8, the bytes each call reads (the stored weight, the
activations in, the fp32 result out) as a fraction of HBM bandwidth, and the bf16 product of the same shape (the
serving path's `linear`, fixed 16-row blocks) beside it.

    python bench/dense_bench.py [--out FILE] [--tp 1,2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from engine.models.glm5_next.config import TextConfig  # noqa: E402
from engine.ops import fused, reference  # noqa: E402
from engine.quant.dense import quantize  # noqa: E402

HBM_BYTES_S = 4.8e12  # H200
ROWS = (1, 2, 4, 8, 16, 64)


def shapes(tp: int) -> dict[str, tuple[int, int]]:
    """[out, in] of each dense weight of one layer on one rank at TP=tp (the real config's widths)."""
    t = TextConfig.from_file(ROOT / "engine/checkpoint/glm53_flash_config.json")
    h, kd, kh = t.hidden_size, t.linear_head_dim, t.linear_num_heads
    heads, nope, v = t.num_attention_heads, t.qk_nope_head_dim, t.v_head_dim
    return {
        "kda_in_proj": ((3 * kh * kd + kh) // tp + 2 * kd, h),
        "kda_o_proj": (h, kh * kd // tp),
        "dsa_x_proj": (t.q_lora_rank + t.kv_lora_rank + 2 * t.index_head_dim + t.index_n_heads, h),
        "dsa_q_b": (heads * nope // tp, t.q_lora_rank),
        "dsa_o_proj": (h, heads * v // tp),
        "shared_gate_up": (2 * t.moe_intermediate_size // tp, h),
        "shared_down": (h, t.moe_intermediate_size // tp),
        "dense_gate_up": (2 * t.intermediate_size // tp, h),
        "dense_down": (h, t.intermediate_size // tp),
        "lm_head": (t.vocab_size // tp, h),
    }


def timed(fn, repeat: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def sweep(out_path: Path | None) -> None:
    """Time every launch shape in a small grid on two of the real shapes (tall, wide) at 8 rows, q4 and fp8."""
    import itertools

    from engine.ops.triton_dense import dense_rows, launch_shape

    gen = torch.Generator(device="cuda").manual_seed(0)
    found: dict = {}
    for name, (out, width) in [
        ("kda_in_proj", (24896, 4096)),
        ("kda_o_proj", (4096, 8192)),
        ("shared_down", (4096, 2048)),
    ]:
        weight = (torch.randn(out, width, generator=gen, device="cuda") * 0.02).bfloat16()
        for mode in ("q4", "fp8"):
            stored = quantize(weight, mode)
            default = launch_shape(out, width, mode == "fp8", stored.group)  # type: ignore[union-attr]
            results = []
            for block_o, mult, splits, warps, stages in itertools.product(
                (64, 128, 256), (1, 2, 4), (1, 4), (4, 8), (3,)
            ):
                tuning = dict(block_o=block_o, block_k=mult * 64, splits=splits, num_warps=warps, num_stages=stages)
                if (out // block_o) * splits > 4096 or width // splits < mult * 64:
                    continue
                x = torch.randn(8, width, generator=gen, device="cuda")
                try:
                    seconds = timed(lambda: dense_rows(x, stored, tuning), repeat=20)
                except Exception as exc:  # noqa: BLE001 - a shape the compiler refuses is a result too
                    results.append({**tuning, "error": type(exc).__name__})
                    continue
                moved = stored.nbytes() + x.numel() * 4 + 8 * out * 4  # type: ignore[union-attr]
                results.append(
                    {**tuning, "us": round(seconds * 1e6, 1), "hbm": round(moved / seconds / HBM_BYTES_S, 3)}
                )
            timed_ok = sorted((r for r in results if "us" in r), key=lambda r: r["us"])
            found[f"{name}/{mode}"] = {"default": default, "best": timed_ok[:8]}
            print(name, mode, "default", default, "best", timed_ok[:3], flush=True)
            if out_path:
                out_path.write_text(json.dumps(found, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--sweep", action="store_true", help="time launch shapes on three weights instead")
    args = ap.parse_args()
    if args.sweep:
        sweep(args.out)
        return
    reference.require_row_invariance()  # the bf16 baseline as the serving path runs it with drafts (16-row blocks)
    gen = torch.Generator(device="cuda").manual_seed(0)
    result: dict = {"gpu": torch.cuda.get_device_name(), "hbm_bytes_s": HBM_BYTES_S, "shapes": {}}
    for tp in (int(t) for t in args.tp.split(",")):
        for name, (out, width) in shapes(tp).items():
            weight = (torch.randn(out, width, generator=gen, device="cuda") * 0.02).bfloat16()
            row: dict = {"shape": [out, width]}
            for mode in ("bf16", "q4", "fp8"):
                stored = weight if mode == "bf16" else quantize(weight, mode)
                held = weight.numel() * 2 if mode == "bf16" else stored.nbytes()  # type: ignore[union-attr]
                figures = {}
                for rows in ROWS:
                    x = torch.randn(rows, width, generator=gen, device="cuda")
                    seconds = timed(lambda: fused.linear(x, stored))
                    moved = held + x.numel() * 4 + rows * out * 4
                    figures[rows] = {
                        "us": round(seconds * 1e6, 1),
                        "hbm_fraction": round(moved / seconds / HBM_BYTES_S, 3),
                    }
                row[mode] = figures
                print(
                    f"tp{tp} {name} {out}x{width} {mode}: "
                    + ", ".join(f"{r}: {f['us']} us {f['hbm_fraction']:.0%}" for r, f in figures.items()),
                    flush=True,
                )
            result["shapes"][f"tp{tp}/{name}"] = row
            del weight
            if args.out:
                args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
