"""The engine's KDA prompt path on a GPU (engine/ops/fla_kda.py: fla-core's chunk_kda) at GLM-5.3-Flash's shapes
(64 heads of 128 at TP=1), against the torch chunked form and the token-by-token delta rule.

    TRITON_F32_DEFAULT=tf32x3 python bench/kda_prompt_bench.py --out kda_prompt.json [--lengths 2048,8192]

For each prompt length T (one stream, state carried in): the first call's time (compile and autotune in a fresh
cache), then per call (`triton.testing.do_bench`) for fla-core and for `ops.kda_chunked`, and the largest
difference of fla-core's output and final state from the token-by-token form (`kda.kda_steps`, fp32 torch on the
same GPU), relative to the largest magnitude. TRITON_F32_DEFAULT picks the fp32 `tl.dot` precision (the engine's
default is fla_kda.PRECISION); run once per precision, each in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kda_bench import D, H, prompt_inputs, rel  # noqa: E402  (bench/ is on the path: this script's folder)

from engine import ops  # noqa: E402
from engine.models.glm5_next.kda import kda_steps  # noqa: E402
from engine.ops import fla_kda  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--lengths", default="2048,8192")
    ap.add_argument("--torch-chunked", action="store_true", help="also time ops.kda_chunked (50 ms a layer at 2k)")
    args = ap.parse_args()
    import triton
    import triton.testing

    device = torch.device("cuda")
    if not fla_kda.usable(device, D):
        raise SystemExit("fla-core is not importable here")
    result: dict = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "precision": os.environ.get("TRITON_F32_DEFAULT"),
        "heads": H,
        "head_dim": D,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prompt": {},
    }
    for length in (int(n) for n in args.lengths.split(",")):
        s0, q, k, v, gate, beta = prompt_inputs(length)
        row = result["prompt"][f"t{length}"] = {}
        with torch.no_grad():
            started = time.monotonic()
            out, state = fla_kda.kda_chunked(s0, q, k, v, gate, beta)
            torch.cuda.synchronize()
            row["first_call_s"] = round(time.monotonic() - started, 1)
            want_out, want_state = kda_steps(s0, q, k, v, gate, beta)
            row["vs_token_steps"] = {"out": rel(out, want_out), "state": rel(state, want_state)}
            row["fla_ms"] = round(
                triton.testing.do_bench(lambda: fla_kda.kda_chunked(s0, q, k, v, gate, beta), rep=200), 3
            )
            row["fla_tok_s"] = round(length / (row["fla_ms"] / 1e3))
            if args.torch_chunked:
                chunk_out, chunk_state = ops.kda_chunked(s0, q, k, v, gate, beta)
                row["torch_chunked_vs_token_steps"] = {
                    "out": rel(chunk_out, want_out),
                    "state": rel(chunk_state, want_state),
                }
                row["torch_chunked_ms"] = round(
                    triton.testing.do_bench(lambda: ops.kda_chunked(s0, q, k, v, gate, beta), rep=200), 2
                )
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
