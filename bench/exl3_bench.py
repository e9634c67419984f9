"""EXL3 expert matmul throughput on one GPU: our Triton decode-GEMV against a bf16 expert of the same shape.

GLM-5.3-Flash routed expert: gate and up 4096 -> 2048 (two matrices), down 2048 -> 4096; EXL3 4-bit mcg (the served
checkpoint's experts). For rows M = 1..8:

- `window`: 8 experts (one token's top-8) each applied to the same M rows (a verify window whose tokens share their
  experts: each expert's trellis is read once for the M rows);
- `batch`: 8·M distinct experts, one row each (M decode streams, no expert shared).

- `moe`: the routed experts as the engine runs them (engine/ops/triton_exl3.routed_experts: rotations, gate/up and
  down decode-GEMVs, SwiGLU, weighted sum) for T = 1, 2, 4, 8 tokens, each choosing top-k distinct experts of the
  layer's bank (288 experts; shapes and top-k read from engine/checkpoint/glm53_flash_config.json), against the bf16
  experts' sync-free pair-GEMV MoE (engine/ops/triton_moe.routed_experts); EXL3 with the default launch options
  (what the engine runs) and with the sweep's best. Bytes = the chosen experts' weights (each read once).

Timed per projection launch set: gate+up in one launch (16·… matrices), down in one launch. Figures:
`kernel` = the decode-GEMV launch(es) alone; `op` = the whole exl3_matmul (input rotation, GEMV, output rotation);
bf16 `torch` = one F.linear per expert (gate‖up fused [4096, 4096], then down); bf16 `pair_gemv` = our Triton kernel
for bf16 experts (engine/ops/triton_moe.py). Bytes = weight bytes of the distinct experts read (EXL3: trellis only,
12.6 MB an expert; bf16: 50.3 MB an expert); HBM fraction against 4.8 TB/s. Timing: triton.testing.do_bench (median,
L2 flushed before each run), experts drawn from a bank larger than L2.

    PYTHONPATH=. python bench/exl3_bench.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from engine.ops import triton_exl3 as tx
from engine.ops.triton_moe import pair_gemv
from engine.ops.triton_moe import routed_experts as bf16_routed
from engine.quant import exl3

FLASH = json.loads((Path(__file__).resolve().parents[1] / "engine/checkpoint/glm53_flash_config.json").read_text())
HIDDEN, INTER, TOP_K, EXPERTS = (
    FLASH["text_config"][k] for k in ("hidden_size", "moe_intermediate_size", "num_experts_per_tok", "n_routed_experts")
)
HBM = 4.8e12
BANK = 64  # experts in the banks (EXL3: 0.8 GB, bf16: 3.2 GB), well beyond the 60 MB L2
SMOKE = False  # --smoke: tiny shapes on the CPU in Triton's interpreter (checks the script only)


def _ms(fn) -> float:
    if SMOKE:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget", type=float, default=130.0, help="seconds; what is left is skipped")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    t_start = time.time()
    dev = "cuda"
    if args.smoke:
        global HIDDEN, INTER, BANK, SMOKE, EXPERTS
        HIDDEN, INTER, BANK, SMOKE, EXPERTS, dev = 256, 128, 16, True, 64, "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    torch.manual_seed(0)
    words = 64  # 16 * 4 bits
    # EXL3 banks: gate and up as matrices 2e and 2e+1 of one [2E, K/16, N/16, 64] bank; down [E, ...]
    gate_up_t = torch.randint(
        -32768, 32768, (2 * BANK, HIDDEN // 16, INTER // 16, words), device=dev, generator=gen, dtype=torch.int32
    ).to(torch.int16)
    down_t = torch.randint(
        -32768, 32768, (BANK, INTER // 16, HIDDEN // 16, words), device=dev, generator=gen, dtype=torch.int32
    ).to(torch.int16)
    suh_gu = torch.rand(2 * BANK, HIDDEN, device=dev, generator=gen).half() + 0.5
    svh_gu = torch.rand(2 * BANK, INTER, device=dev, generator=gen).half() + 0.5
    suh_d = torch.rand(BANK, INTER, device=dev, generator=gen).half() + 0.5
    svh_d = torch.rand(BANK, HIDDEN, device=dev, generator=gen).half() + 0.5
    # bf16 banks as the engine stacks them: gate_up [E, 2I, H], down [E, H, I]
    w_gu = (torch.randn(BANK, 2 * INTER, HIDDEN, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    w_d = (torch.randn(BANK, HIDDEN, INTER, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    exl3_expert_bytes = (gate_up_t[:2].numel() + down_t[:1].numel()) * 2
    bf16_expert_bytes = (w_gu[0].numel() + w_d[0].numel()) * 2

    # copy bandwidth on this GPU (read + write), for the ceiling actually reachable
    big = torch.empty(2**20 if SMOKE else 2**30, dtype=torch.uint8, device=dev)
    copy_ms = _ms(big.clone)
    copy_tbs = 2 * big.numel() / copy_ms / 1e9
    del big

    result = {
        "schema": "exl3-bench/2",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": _commit(),
        "hbm_peak_tbs": HBM / 1e12,
        "copy_tbs_measured": copy_tbs,
        "shape": {
            "hidden": HIDDEN,
            "intermediate": INTER,
            "bits": 4,
            "codebook": "mcg",
            "experts": EXPERTS,
            "top_k": TOP_K,
        },
        "exl3_expert_bytes": exl3_expert_bytes,
        "bf16_expert_bytes": bf16_expert_bytes,
        "configs": [],
        "rows": [],
        "skipped": [],
    }

    def exl3_launches(groups: int, m: int, experts: torch.Tensor, kw: dict):
        """(kernel-only fn, whole-op fn) for `groups` experts × m rows."""
        mats_gu = torch.stack([2 * experts, 2 * experts + 1], 1).reshape(-1).to(torch.int32)
        mats_d = experts.to(torch.int32)
        rows = 1 << (m - 1).bit_length()
        xp_gu = torch.randn(2 * groups, rows, HIDDEN, device=dev)
        xp_d = torch.randn(groups, rows, INTER, device=dev)
        x = torch.randn(groups, m, HIDDEN, device=dev)
        h = torch.randn(groups, m, INTER, device=dev)
        x2 = x.repeat_interleave(2, 0)

        def kernel():
            tx.exl3_gemv_parts(xp_gu, gate_up_t, mats_gu, "mcg", **kw)
            tx.exl3_gemv_parts(xp_d, down_t, mats_d, "mcg", **kw)

        def op():
            tx.exl3_matmul(x2, gate_up_t, suh_gu, svh_gu, mats_gu, "mcg", **kw)
            tx.exl3_matmul(h, down_t, suh_d, svh_d, mats_d, "mcg", **kw)

        return kernel, op

    # a few launch configurations at the decode shape (8 experts, 1 row); the best serves every row count
    experts8 = torch.randperm(BANK, device=dev)[:TOP_K]
    configs = [
        {},
        {"block_n_tiles": 8},
        {"block_n_tiles": 4},
        {"num_warps": 2},
        {"block_n_tiles": 16, "num_warps": 8},
        {"unroll": 4},
    ]
    configs = configs[:2] if SMOKE else configs
    best, best_ms = {}, float("inf")
    for kw in configs:
        if time.time() - t_start > args.budget * 0.35:
            result["skipped"].append(f"config {kw}")
            continue
        try:
            kernel, _ = exl3_launches(TOP_K, 1, experts8, kw)
            ms = _ms(kernel)
            compiled = tx.LAST_LAUNCH.get("gemv")
            regs = {"n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None)}
        except Exception as exc:  # a configuration that does not compile
            result["configs"].append({"kw": kw, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        result["configs"].append({"kw": kw, "kernel_ms": ms, **regs})
        print(f"config {kw}: {ms * 1e3:.1f} us", flush=True)
        if ms < best_ms:
            best, best_ms = kw, ms
    result["best_config"] = best
    result["default_config"] = dict(tx.LAUNCH_DEFAULTS)
    if time.time() - t_start < args.budget * 0.75:
        moe_rows(result, best, dev, gen)
    else:
        result["skipped"].append("moe")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)

    for scenario in ("window", "batch"):
        for m in range(1, 9) if scenario == "window" else (1, 2, 4, 8):
            if time.time() - t_start > args.budget:
                result["skipped"].append(f"{scenario} M={m}")
                continue
            if scenario == "window":
                experts, rows_each = experts8, m
            else:
                experts, rows_each = torch.randperm(BANK, device=dev)[: TOP_K * m], 1
            groups = experts.numel()
            kernel, op = exl3_launches(groups, rows_each, experts, best)
            e = experts.tolist()
            x = torch.randn(groups * rows_each, HIDDEN, device=dev)
            hid = torch.randn(groups * rows_each, INTER, device=dev)
            xb, hb = x.to(torch.bfloat16), hid.to(torch.bfloat16)

            def torch_bf16():
                for g, ex in enumerate(e):
                    rows = slice(g * rows_each, (g + 1) * rows_each)
                    torch.nn.functional.linear(xb[rows], w_gu[ex])
                    torch.nn.functional.linear(hb[rows], w_d[ex])

            pairs = experts.repeat_interleave(rows_each).to(torch.int32)

            def triton_bf16():
                pair_gemv(x, w_gu, pairs, rows_per_pair=1)
                pair_gemv(hid, w_d, pairs, rows_per_pair=1)

            row = {
                "scenario": scenario,
                "rows": m,
                "experts": groups,
                "rows_per_expert": rows_each,
                "exl3_bytes": groups * exl3_expert_bytes,
                "bf16_bytes": groups * bf16_expert_bytes,
            }
            for name, fn in (
                ("exl3_kernel", kernel),
                ("exl3_op", op),
                ("bf16_torch", torch_bf16),
                ("bf16_pair_gemv", triton_bf16),
            ):
                ms = _ms(fn)
                nbytes = row["exl3_bytes"] if name.startswith("exl3") else row["bf16_bytes"]
                row[name] = {"us": ms * 1e3, "gbs": nbytes / ms / 1e6, "hbm_fraction": nbytes / ms / 1e-3 / HBM}
            result["rows"].append(row)
            print(
                f"{scenario} M={m}: "
                + "  ".join(
                    f"{k} {row[k]['us']:.1f} us ({row[k]['hbm_fraction']:.1%})"
                    for k in ("exl3_kernel", "exl3_op", "bf16_torch", "bf16_pair_gemv")
                ),
                flush=True,
            )
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    result["seconds"] = time.time() - t_start
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(
        json.dumps(
            {k: result[k] for k in ("gpu", "torch", "triton", "copy_tbs_measured", "best_config", "skipped", "seconds")}
        )
    )
    return 0


def moe_rows(result: dict, best: dict, dev: str, gen: torch.Generator) -> None:
    """The `moe` scenario: the whole routed-experts op on a bank of the layer's real size, EXL3 vs bf16."""

    def bank(matrices: int, k: int, n: int) -> exl3.Exl3Bank:
        return exl3.Exl3Bank(
            torch.randint(
                -32768, 32768, (matrices, k // 16, n // 16, 64), device=dev, generator=gen, dtype=torch.int32
            ).to(torch.int16),
            (torch.rand(matrices, k, device=dev, generator=gen) / k**0.5).half(),
            (torch.rand(matrices, n, device=dev, generator=gen) + 0.5).half(),
            "mcg",
        )

    gate_up, down = bank(2 * EXPERTS, HIDDEN, INTER), bank(EXPERTS, INTER, HIDDEN)
    w_gu = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    w_d = (torch.randn(EXPERTS, HIDDEN, INTER, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    exl3_bytes = (gate_up.trellis[:2].numel() + down.trellis[:1].numel()) * 2
    bf16_bytes = (w_gu[0].numel() + w_d[0].numel()) * 2
    default = dict(tx.LAUNCH_DEFAULTS)
    for tokens in (1, 2) if SMOKE else (1, 2, 4, 8):
        chosen = torch.randperm(EXPERTS, device=dev)[: TOP_K * tokens].view(tokens, TOP_K)  # distinct experts
        weights = torch.rand(tokens, TOP_K, device=dev)
        x = torch.randn(tokens, HIDDEN, device=dev)
        pairs = tokens * TOP_K
        row = {
            "scenario": "moe",
            "tokens": tokens,
            "pairs": pairs,
            "exl3_bytes": pairs * exl3_bytes,
            "bf16_bytes": pairs * bf16_bytes,
        }
        timings = {}
        # default timed before and after the best: the first timing of a row ran slow in an earlier run (warm-up)
        for name, kw in (("exl3_moe_default", default), ("exl3_moe_best", best), ("exl3_moe_default_again", default)):
            tx.LAUNCH_DEFAULTS.clear()
            tx.LAUNCH_DEFAULTS.update(kw)
            timings[name] = _ms(lambda: tx.routed_experts(x, chosen, weights, gate_up, down, 10.0))
        tx.LAUNCH_DEFAULTS.clear()
        tx.LAUNCH_DEFAULTS.update(default)
        timings["bf16_moe_pair_gemv"] = _ms(lambda: bf16_routed(x, chosen, weights, w_gu, w_d, 10.0))
        for name, ms in timings.items():
            nbytes = row["exl3_bytes"] if name.startswith("exl3") else row["bf16_bytes"]
            row[name] = {"us": ms * 1e3, "gbs": nbytes / ms / 1e6, "hbm_fraction": nbytes / ms / 1e-3 / HBM}
        result["rows"].append(row)
        print(
            f"moe T={tokens}: "
            + "  ".join(f"{k} {row[k]['us']:.1f} us ({row[k]['hbm_fraction']:.1%})" for k in timings),
            flush=True,
        )


if __name__ == "__main__":
    raise SystemExit(main())
