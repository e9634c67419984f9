"""The EXL3 decode GEMV's two forms on one GPU, at GLM-5.3-Flash's routed-expert shapes: `_exl3_gemv` (fp32 FMAs,
"fma") against `_exl3_gemv_mma` (the tensor cores, "mma"), and the mma form's launch options.

Shapes: an expert's gate and up (K = 4096 -> N = the width, one launch for both, `paired`) and its down (width ->
4096), at TP=1 (width 2,048) or TP=2's shard (1,024: `--shard 2`), EXL3 4-bit mcg (the served checkpoint's
experts). Cases, each a set of (row group, expert) launches through both products:
- `pairs P`: P distinct experts, one row each (decode: 8 pairs a token at top-8; 32 = four streams, or a verify
  window of 4 whose rows chose other experts);
- `window M`: 8 experts, each applied to the same M rows (a verify window whose tokens share their experts).

Timing: each case is captured R times in one CUDA graph, each copy over other experts of a 288-expert bank (0.9 /
1.8 GB), so the trellis comes from HBM, not L2; time a case = graph time / R (median of triton's
do_bench_cudagraph). Bytes = the trellis words each case reads; % of HBM against 4.8 TB/s. Accuracy: each form's
sum of partials against a float64 product of the same rows and decoded W_q (max |error| / max |exact|).
`moe T`: the whole routed-experts op (engine/ops/triton_exl3.routed_experts: rotations, both GEMVs, SwiGLU, the
weighted sum) for T tokens of top-8 distinct experts, each form, same graph method.

    PYTHONPATH=. python bench/exl3_gemv_bench.py --shard 2 --out exl3_gemv.json [--sweep] [--budget 200]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import triton
from exl3_prompt_bench import random_bank
from triton.testing import do_bench_cudagraph

from engine.ops import triton_exl3 as tx

FLASH = json.loads((Path(__file__).resolve().parents[1] / "engine/checkpoint/glm53_flash_config.json").read_text())
HIDDEN, INTER, TOP_K, EXPERTS = (
    FLASH["text_config"][k] for k in ("hidden_size", "moe_intermediate_size", "num_experts_per_tok", "n_routed_experts")
)
HBM = 4.8e12
COPIES = 8  # copies of a case in one graph, each over other experts


def _graph_us(fn) -> float:
    return do_bench_cudagraph(fn, rep=60) * 1e3 / COPIES


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shard", type=int, default=2, help="TP degree whose expert shard to run (1 or 2)")
    parser.add_argument("--sweep", action="store_true", help="also time the mma form's launch options")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds; what is left is skipped")
    args = parser.parse_args()
    t0 = time.time()
    width = INTER // args.shard
    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up, down = random_bank(2 * EXPERTS, HIDDEN, width, gen), random_bank(EXPERTS, width, HIDDEN, gen)
    expert_bytes = (gate_up.trellis[:2].numel() + down.trellis[:1].numel()) * 2
    result: dict = {
        "schema": "exl3-gemv-bench/1",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shard": args.shard,
        "shape": {"hidden": HIDDEN, "width": width, "experts": EXPERTS, "top_k": TOP_K},
        "expert_bytes": expert_bytes,
        "copies_a_graph": COPIES,
        "rows": [],
        "sweep": [],
        "moe": [],
        "skipped": [],
    }

    def save() -> None:
        result["seconds"] = time.time() - t0
        Path(args.out).write_text(json.dumps(result, indent=1))

    def case(experts: int, rows: int):
        """COPIES sets of `experts` distinct experts (disjoint within a set), their rows, and a fn running both
        products of every set; plus the first set's float64 check."""
        sets = [torch.randperm(EXPERTS, device="cuda", generator=gen)[:experts].to(torch.int32) for _ in range(COPIES)]
        xg = [torch.randn(2 * experts, rows, HIDDEN, device="cuda", generator=gen) for _ in sets]
        xd = [torch.randn(experts, rows, width, device="cuda", generator=gen) for _ in sets]

        def run(**kw):
            order = tx.gemv_order(torch.device("cuda"), kw.get("form"))
            ins = [
                (tx.kernel_order(a) if order == "gemv" else a, tx.kernel_order(b) if order == "gemv" else b)
                for a, b in zip(xg, xd)
            ]

            def fn():
                for mats, (a, b) in zip(sets, ins):
                    tx.exl3_gemv_parts(a, gate_up.trellis, mats, "mcg", paired=True, **kw)
                    tx.exl3_gemv_parts(b, down.trellis, mats, "mcg", **kw)

            def error() -> float:
                mats, b = sets[0], ins[0][1]
                got = tx.exl3_gemv_parts(b, down.trellis, mats, "mcg", **kw).sum(0).double()
                worst = 0.0
                for g, e in enumerate(mats.tolist()[:2]):
                    wq = tx.exl3_unpack(down.trellis[e], "mcg").double()
                    exact = xd[0][g].double() @ wq
                    worst = max(worst, float((got[g] - exact).abs().max() / exact.abs().max()))
                return worst

            return fn, error

        return run, COPIES * experts * expert_bytes

    cases = [("pairs", 8, 1), ("pairs", 16, 1), ("pairs", 32, 1), ("pairs", 64, 1)]
    cases += [("window", 8, 2), ("window", 8, 4), ("window", 8, 8)]
    for kind, experts, rows in cases:
        if time.time() - t0 > args.budget * 0.5:
            result["skipped"].append(f"{kind} {experts}x{rows}")
            continue
        run, nbytes = case(experts, rows)
        row = {"case": kind, "experts": experts, "rows": rows, "bytes": nbytes // COPIES}
        for form in tx.GEMV_FORMS:
            fn, error = run(form=form)
            us = _graph_us(fn)
            row[form] = {"us": us, "hbm": nbytes / COPIES / (us * 1e-6) / HBM, "rel_error": error()}
            compiled = tx.LAST_LAUNCH.get("gemv")
            row[form]["registers"] = getattr(compiled, "n_regs", None)
        row["mma_speedup"] = row["fma"]["us"] / row["mma"]["us"]
        result["rows"].append(row)
        print(
            f"{kind} {experts}x{rows}: fma {row['fma']['us']:.1f} us ({row['fma']['hbm']:.1%}, err "
            f"{row['fma']['rel_error']:.1e})  mma {row['mma']['us']:.1f} us ({row['mma']['hbm']:.1%}, err "
            f"{row['mma']['rel_error']:.1e})  {row['mma_speedup']:.2f}x",
            flush=True,
        )
        save()

    if args.sweep:
        launches = [
            {"block_n_tiles": b, "num_warps": w, "unroll": u} for b in (8, 16) for w in (2, 4) for u in (1, 2, 4)
        ] + [{"block_n_tiles": 8, "num_warps": 4, "unroll": 4, "split": s} for s in (4, 8, 32)]
        for experts, rows in ((8, 1), (32, 1), (8, 4)):
            run, nbytes = case(experts, rows)
            for kw in launches:
                if time.time() - t0 > args.budget * 0.85:
                    result["skipped"].append(f"sweep {experts}x{rows} {kw}")
                    continue
                try:
                    fn, _ = run(form="mma", **kw)
                    us = _graph_us(fn)
                except Exception as exc:  # a launch the shapes do not allow
                    result["sweep"].append({"experts": experts, "rows": rows, **kw, "error": str(exc)[:200]})
                    continue
                hbm = nbytes / COPIES / (us * 1e-6) / HBM
                result["sweep"].append({"experts": experts, "rows": rows, **kw, "us": us, "hbm": hbm})
                print(f"sweep {experts}x{rows} {kw}: {us:.1f} us ({hbm:.1%})", flush=True)
            save()

    for tokens in (1, 4):
        if time.time() - t0 > args.budget:
            result["skipped"].append(f"moe {tokens}")
            continue
        chosen = [
            torch.randperm(EXPERTS, device="cuda", generator=gen)[: TOP_K * tokens].view(tokens, TOP_K)
            for _ in range(COPIES)
        ]
        weights = torch.rand(tokens, TOP_K, device="cuda", generator=gen)
        x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen)
        row = {"tokens": tokens, "pairs": tokens * TOP_K, "bytes": tokens * TOP_K * expert_bytes}
        outs = {}
        for form in tx.GEMV_FORMS:
            tx.LAUNCH_DEFAULTS["form"] = form

            def fn():
                for c in chosen:
                    tx.routed_experts(x, c, weights, gate_up, down, 10.0)

            us = _graph_us(fn)
            outs[form] = tx.routed_experts(x, chosen[0], weights, gate_up, down, 10.0)
            row[form] = {"us": us, "hbm": row["bytes"] / (us * 1e-6) / HBM}
        tx.LAUNCH_DEFAULTS.pop("form", None)
        row["forms_rel_difference"] = float((outs["mma"] - outs["fma"]).abs().max() / outs["fma"].abs().max())
        result["moe"].append(row)
        print(
            f"moe T={tokens}: fma {row['fma']['us']:.1f} us ({row['fma']['hbm']:.1%})  mma {row['mma']['us']:.1f} us "
            f"({row['mma']['hbm']:.1%}); forms differ by {row['forms_rel_difference']:.1e}",
            flush=True,
        )
        save()
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
