"""fla-core's `chunk_kda` in the forms it offers for a bounded gate, at one KDA layer's prompt chunk (GLM-5.3-Flash:
64 heads of 128 at TP=1, 32 at TP=2): time and error against the delta rule in fp64.

Forms (each timed with the gate work it needs outside fla-core, median of 20 calls after 3 warm-up calls):
- `ours`: the engine's form before session 37 (`fla_kda.kda_chunked`): the log-decay g = lower_bound · sigmoid(e^A_log · (raw +
  dt_bias)) and beta = sigmoid(b) in torch, then `chunk_kda(g, beta)`;
- `safe`: the same g and beta, `safe_gate=True` (fla-core's tensor-core form of the diagonal blocks, which it allows
  for gates bounded in [lower_bound, 0));
- `in_kernel`: raw, A_log, dt_bias and the beta logits handed to fla-core (`use_gate_in_kernel`,
  `use_beta_sigmoid_in_kernel`), plain diagonal blocks (the engine's form since, `fla_kda.kda_gated`, hands it beta
  after its own sigmoid: one launch either way);
- `in_kernel_safe`: the same with `safe_gate=True`.
Error: the largest absolute difference of the output and of the final state from `reference.kda_chunked` run in
fp64 on the same fp32 inputs (q, k unit rows, q scaled by d^-1/2, a nonzero starting state).

    python bench/fla_gate_bench.py [--tokens 2048] [--heads 64,32] [--out fla_gate.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.models.glm5_next.kda import log_decay  # noqa: E402
from engine.ops import fla_kda, reference  # noqa: E402

LOWER_BOUND = -5.0  # GLM-5.3-Flash's linear_attn_config.gate_lower_bound


def inputs(tokens: int, heads: int, dim: int, seed: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    q = reference.l2norm(randn(tokens, heads, dim)) * dim**-0.5
    k = reference.l2norm(randn(tokens, heads, dim))
    a_log = torch.log(1 + 15 * torch.rand(heads, device="cuda", generator=gen))
    return {
        "state": 0.1 * randn(heads, dim, dim),
        "q": q,
        "k": k,
        "v": randn(tokens, heads, dim),
        "raw": randn(tokens, heads, dim),
        "a_log": a_log,
        "dt_bias": 0.5 * randn(heads * dim),
        "b": randn(tokens, heads),
    }


def torch_gates(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's torch form of the gates: the log-decay (`kda.log_decay`) and beta."""
    g = log_decay(x["raw"].flatten(1), x["dt_bias"], x["a_log"].exp(), LOWER_BOUND)
    return g, torch.sigmoid(x["b"])


def run(form: str, x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    chunk_kda = fla_kda._chunk_kda()
    common = {"scale": 1.0, "initial_state": x["state"][None], "output_final_state": True}
    if form in ("ours", "safe"):
        g, beta = torch_gates(x)
        out, final = chunk_kda(
            x["q"][None], x["k"][None], x["v"][None], g[None], beta[None], **common,
            **({"safe_gate": True, "lower_bound": LOWER_BOUND} if form == "safe" else {}),
        )  # fmt: skip
    else:
        out, final = chunk_kda(
            x["q"][None], x["k"][None], x["v"][None], x["raw"][None], x["b"][None], **common,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, A_log=x["a_log"], dt_bias=x["dt_bias"],
            lower_bound=LOWER_BOUND, safe_gate=form == "in_kernel_safe",
        )  # fmt: skip
    return out[0], final[0]


def timed(fn, calls: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--heads", default="64,32")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not fla_kda.usable(torch.device("cuda"), args.dim):
        sys.exit("fla-core is not importable here")
    result: dict = {"tokens": args.tokens, "dim": args.dim, "gpu": torch.cuda.get_device_name(), "rows": []}
    with torch.no_grad():
        for heads in (int(h) for h in args.heads.split(",")):
            x = inputs(args.tokens, heads, args.dim)
            g, beta = torch_gates(x)
            ref_out, ref_state = reference.kda_chunked(
                *(t.double() for t in (x["state"], x["q"], x["k"], x["v"], g, beta))
            )
            for form in ("ours", "safe", "in_kernel", "in_kernel_safe"):
                try:
                    out, state = run(form, x)
                    row = {
                        "heads": heads,
                        "form": form,
                        "us": round(timed(lambda form=form: run(form, x)), 1),
                        "out_err": (out.double() - ref_out).abs().max().item(),
                        "state_err": (state.double() - ref_state).abs().max().item(),
                        "out_scale": ref_out.abs().max().item(),
                    }
                except Exception as exc:  # a form this fla-core does not take: said, and the others still run
                    row = {"heads": heads, "form": form, "error": f"{type(exc).__name__}: {exc}"[:300]}
                print(json.dumps(row), flush=True)
                result["rows"].append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
