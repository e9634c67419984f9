"""engine/ops/triton_rows.py against the products it replaces, on the GPU, at GLM-5.3-Flash's TP=2 shard shapes:
the MoE router (one fp32 weight [288, 4,096]) and DSA's absorbed kv_b heads (w_k read as [16, 512, 192] through its
transpose, w_v [16, 256, 512]), for 1, 4 and 16 rows. Each call is timed inside a CUDA graph of 50 calls (as a
served step replays it): the kernel; torch at that row count (cuBLAS's choice: not row-invariant); torch in
`row_blocks`' 16-row padded block (the row-invariant form before session 17), zero-filled and concatenated.

    python bench/rows_bench.py [--out rows.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.ops import triton_rows  # noqa: E402

CALLS = 50


def graph_us(fn, calls: int = CALLS, best: bool = False) -> float:
    """Microseconds a call of `fn`, replayed from a CUDA graph of `calls` calls: the median of 5 replays, or with
    `best` (bench/hc_bench.py) the fastest of 5 after one untimed replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    if best:
        graph.replay()
        torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return round(min(times) if best else sorted(times)[2], 2)


def padded(x: torch.Tensor, fn) -> torch.Tensor:
    pad = -x.shape[0] % 16
    return fn(torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) if pad else x)[: x.shape[0]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    kv_b = torch.randn(16, 192 + 256, 512, device="cuda") * 0.05
    w_k, w_v = kv_b[:, :192], kv_b[:, 192:]
    router = torch.randn(288, 4096, device="cuda")
    cases = {
        "router 288x4096": (4096, 1, router[None], lambda r: r[:, 0] @ router.t()),
        "w_k 16x(192->512)": (192, 16, w_k.transpose(1, 2), lambda r: torch.einsum("bhd,hdr->bhr", r, w_k)),
        "w_v 16x(512->256)": (512, 16, w_v, lambda r: torch.einsum("bhr,hvr->bhv", r, w_v)),
    }
    result = {}
    with torch.no_grad():
        for name, (k, heads, w, torch_form) in cases.items():
            weight_mb = w.numel() * 4 / 1e6
            for rows in (1, 4, 16):
                x = torch.randn(rows, heads, k, device="cuda")
                figures = {
                    "kernel_us": graph_us(lambda: triton_rows.rows_product(x, w)),
                    "torch_us": graph_us(lambda: torch_form(x)),
                    "padded16_us": graph_us(lambda: padded(x, torch_form)),
                    "weight_MB": round(weight_mb, 2),
                }
                figures["kernel_GBps"] = round(weight_mb * 1e-3 / (figures["kernel_us"] * 1e-6), 1)
                result[f"{name}, {rows} rows"] = figures
                print(f"{name}, {rows} rows: {figures}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
