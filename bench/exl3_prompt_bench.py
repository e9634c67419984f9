"""A prompt chunk through one GLM-5.3-Flash MoE layer's routed experts on one GPU: EXL3 experts on the tensor cores
(engine/ops/triton_exl3.grouped_experts: pairs sorted by expert, each expert's trellis decoded once per block of its
pairs straight into fp16 MMA operands, on Hopper as the warpgroup MMA's register operand; VARIANTS: the other launch
options) against the first EXL3 prompt path (`_looped_experts`: per selected expert a host read, W_q decoded whole
to fp16, an fp32 matmul) and against bf16 experts' grouped GEMMs (moe.MoE._grouped:
torch's `_grouped_mm`, what a bf16 checkpoint's prompt runs).

The layer's real bank (288 experts, hidden 4096, width 2048 at TP=1, 1024 at TP=2's shard, top-8; read from
engine/checkpoint/glm53_flash_config.json), random 4-bit mcg trellis, each token's 8 experts drawn uniformly.
Figures per chunk of T tokens: time (median of triton.testing.do_bench), TFLOP/s of the useful products
(2 · pairs · 3 · hidden · width), the share of the H200's dense peak (bf16 989 TFLOP/s, TF32 494), tokens a second
through this layer's experts, and the largest difference from the expert loop (relative to its largest value).

    PYTHONPATH=. python bench/exl3_prompt_bench.py --out exl3_prompt.json [--tokens 128,2048,8192] [--tp 1,2]
        [--variants dot,bm64] [--no-loop] [--no-bf16]

Each grouped form's output also gets a sha256 of its bits: the inputs come from one seed in one order, so a run of
this file against another tree (`env -C OTHER PYTHONPATH=. python THIS/bench/exl3_prompt_bench.py ...`) tells
whether a change kept the bits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch
import triton
from triton.testing import do_bench

from engine.models.glm5_next.moe import MoE
from engine.ops import triton_exl3 as tx
from engine.quant import exl3

FLASH = json.loads((Path(__file__).resolve().parents[1] / "engine/checkpoint/glm53_flash_config.json").read_text())
HIDDEN, INTER, TOP_K, EXPERTS = (
    FLASH["text_config"][k] for k in ("hidden_size", "moe_intermediate_size", "num_experts_per_tok", "n_routed_experts")
)
PEAK = {"bf16": 989e12, "tf32": 494e12}  # H200 dense tensor-core peaks
# launch variants timed beside the default (engine/ops/triton_exl3.PROMPT_LAUNCH)
VARIANTS = {
    "dot": {"form": "dot"},  # `_exl3_grouped`'s tl.dot (fp16 operands through shared memory): other GPUs' form
    "dot_blocks_first": {"form": "dot", "n_first": False, "rotate_rows": 1},  # session 21's default
    "one_fp16_product": {"split_x": False},
    "blocks_first": {"n_first": False},
    "bnt16_8warps": {"bnt": 16, "wgmma_warps": 8},
    "bm128": {"bm": 128},
    "bm64": {"bm": 64},
    "rotate_rows1": {"rotate_rows": 1},
    # the wgmma form's ring of x stages and its register cap
    "kb2": {"stage_tiles": 2},
    "stages4_kb2": {"stages": 4, "stage_tiles": 2},
    "stages4": {"stages": 4},
    "no_maxnreg": {"wgmma_maxnreg": None},
}
ROTATE_VARIANTS = [(1, 1), (2, 1), (4, 1), (4, 2), (8, 2), (8, 4), (16, 4)]  # (rows a program, warps)


def random_bank(matrices: int, k: int, n: int, gen: torch.Generator) -> exl3.Exl3Bank:
    """A random 4-bit mcg bank on the GPU (any trellis bitstream is a valid encoding)."""
    trellis = torch.randint(-32768, 32768, (matrices, k // 16, n // 16, 64), device="cuda", generator=gen)
    return exl3.Exl3Bank(
        trellis.to(torch.int16),
        (torch.rand(matrices, k, device="cuda", generator=gen) / k**0.5).half(),
        (torch.rand(matrices, n, device="cuda", generator=gen) + 0.5).half(),
        "mcg",
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", default="128,2048,8192")
    parser.add_argument("--tp", default="1,2")
    parser.add_argument("--budget", type=float, default=240.0, help="seconds; what is left is skipped")
    parser.add_argument("--no-bf16", action="store_true", help="skip the bf16 bank (14.5 GB at TP=1)")
    parser.add_argument("--variants", default=None, help="comma-separated VARIANTS names to time (default: all)")
    parser.add_argument("--no-loop", action="store_true", help="skip the expert loop (reference and timing)")
    args = parser.parse_args()
    start = time.time()
    result: dict = {
        "schema": "exl3-prompt-bench/1",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "launch": dict(tx.PROMPT_LAUNCH),
        "rows": [],
        "skipped": [],
    }
    gen = torch.Generator(device="cuda").manual_seed(0)
    for tp in (int(t) for t in args.tp.split(",")):
        width = INTER // tp
        gate_up, down = random_bank(2 * EXPERTS, HIDDEN, width, gen), random_bank(EXPERTS, width, HIDDEN, gen)
        bf16 = None
        if not args.no_bf16:
            bf16 = SimpleNamespace(
                stacked=(
                    (torch.randn(EXPERTS, 2 * width, HIDDEN, device="cuda", generator=gen) * 0.02).bfloat16(),
                    (torch.randn(EXPERTS, HIDDEN, width, device="cuda", generator=gen) * 0.02).bfloat16(),
                ),
                top_k=TOP_K,
                limit=10.0,
            )
        for tokens in (int(t) for t in args.tokens.split(",")):
            if time.time() - start > args.budget:
                result["skipped"].append(f"tp{tp} T={tokens}")
                continue
            x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen)
            chosen = torch.rand(tokens, EXPERTS, device="cuda", generator=gen).topk(TOP_K, dim=-1).indices
            weights = torch.rand(tokens, TOP_K, device="cuda", generator=gen)
            pairs = tokens * TOP_K
            flops = 2 * pairs * 3 * HIDDEN * width
            row: dict = {"tp": tp, "tokens": tokens, "pairs": pairs, "tflop": flops / 1e12}

            def grouped(kw: dict):
                return lambda: tx.grouped_experts(x, chosen, weights, gate_up, down, 10.0, **kw)

            chosen_variants = (
                VARIANTS if args.variants is None else {n: VARIANTS[n] for n in args.variants.split(",") if n}
            )
            runs = {
                "exl3_grouped": grouped({}),
                **{f"exl3_grouped_{n}": grouped(kw) for n, kw in chosen_variants.items()},
            }
            loop = tokens <= 2048 and not args.no_loop  # the expert loop: reference and timing
            if loop:
                runs["exl3_looped"] = lambda: tx._looped_experts(x, chosen, weights, gate_up, down, 10.0)
            if bf16 is not None:
                runs["bf16_grouped_mm"] = lambda: MoE._grouped(bf16, x, chosen, weights)  # type: ignore[arg-type]
            reference = tx._looped_experts(x, chosen, weights, gate_up, down, 10.0) if loop else None
            for name, fn in runs.items():
                try:
                    ms = do_bench(fn, warmup=10, rep=60, return_mode="median")
                except Exception as exc:  # a variant that does not compile or fit: say so, keep the rest
                    row[name] = {"error": repr(exc)[:300]}
                    continue
                fp16_mma = name.startswith("exl3_grouped")  # every variant's operands are fp16: bf16's rate
                peak = PEAK["bf16" if fp16_mma or name.startswith("bf16") else "tf32"]
                entry = {
                    "ms": ms,
                    "tflops": flops / ms / 1e9,
                    "peak_fraction": flops / ms / 1e-3 / peak,
                    "tokens_per_s": tokens / ms * 1e3,
                }
                if name.startswith("exl3_grouped"):
                    y = fn()
                    # the output's bits, to compare trees or forms (the same inputs: one seed, one order of draws)
                    entry["sha256"] = hashlib.sha256(y.cpu().numpy().tobytes()).hexdigest()[:16]
                    if reference is not None:
                        entry["max_rel_diff"] = float((y - reference).abs().max() / reference.abs().max())
                row[name] = entry
            # the rotation before gate‖up alone (every pair's x gathered, pre-scaled by its expert's suh, rotated,
            # written in fp32 twice: gate and up), by rows a program and warps
            flat = chosen.reshape(-1)
            order = torch.argsort(flat, stable=True)
            rotation = {}
            for rows_a, warps in ROTATE_VARIANTS:
                ms = do_bench(
                    lambda: tx.rotate_rows(
                        x[None],
                        1,
                        flat[order],
                        pre=gate_up.suh,
                        share=2,
                        paired=True,
                        gather=order // TOP_K,
                        num_warps=warps,
                        block_rows=rows_a,
                    ),
                    warmup=10,
                    rep=40,
                    return_mode="median",
                )
                written = 2 * pairs * HIDDEN * 4
                rotation[f"{rows_a}x{warps}"] = {"ms": ms, "written_tb_s": written / ms / 1e9}
            row["rotate"] = rotation
            result["rows"].append(row)
            print(
                f"tp{tp} T={tokens}: "
                + "  ".join(
                    f"{k} {v['ms']:.2f} ms {v['tflops']:.0f} TF/s"
                    + (f" d={v['max_rel_diff']:.1e}" if "max_rel_diff" in v else "")
                    + (f" {v['sha256']}" if "sha256" in v else "")
                    for k, v in row.items()
                    if isinstance(v, dict) and "ms" in v
                )
                + "  rotate "
                + " ".join(f"{k} {v['ms']:.3f}" for k, v in row["rotate"].items()),
                flush=True,
            )
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    result["seconds"] = time.time() - start
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
