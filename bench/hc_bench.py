"""The hyper-connection kernels of a decode step (engine/ops/triton_mhc.py) under other launches: µs a call of
`hc_pre` (`_hc_dots` + `_hc_mix`) and of `hc_post`, replayed from a CUDA graph of CALLS calls, at GLM-5.3-Flash's
widths (4 streams of 4,096, 24 logits), for 1 and 4 tokens. Each variant's outputs are compared with the default's
(max abs difference: a chunk width other than the default sums in another order).

    python bench/hc_bench.py [--out hc_bench.json]
    python bench/hc_bench.py --prompt   # a 2,048-token prompt chunk's `_hc_mix` columns a step and warps instead

Then (not with --prompt) a step's sublayer as served, `_hc_post` making the next map's sums (two launches), against
the three launches it replaced.

Variants: chunk width (hidden columns a program), warps of `_hc_dots` and `_hc_mix`, and Sinkhorn iterations 20
(the model's) against 1 (what the iterations cost; not a served form). The first variant (4 warps each) is the
launch before session 19 and the reference of the differences; the served one is (128, 4, 1, 20).
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
from rows_bench import graph_us  # noqa: E402

from engine.ops import triton_mhc  # noqa: E402

CALLS = 100
VARIANTS = [  # (chunk, dots warps, mix warps, iterations)
    (128, 4, 4, 20),
    (128, 4, 2, 20),
    (128, 4, 1, 20),
    (128, 2, 1, 20),
    (128, 8, 1, 20),
    (64, 4, 1, 20),
    (64, 2, 1, 20),
    (32, 2, 1, 20),
    (256, 4, 1, 20),
    (128, 4, 4, 1),
    (128, 4, 1, 1),
]


PROMPT_VARIANTS = [(128, 4), (256, 4), (512, 4), (512, 8), (1024, 8)]  # a prompt chunk's `_hc_mix`: columns, warps


def prompt_chunk(fn, base, scale, norm, gen, result: dict) -> None:
    """`hc_pre` of a 2,048-token prompt chunk (the dot products' cuBLAS product and `_hc_mix`, one program a token)
    under PROMPT_VARIANTS, and `hc_post`: µs a call, best of five graphs of 10 calls."""
    n, hidden = 4, 4096
    streams = torch.randn(2048, n, hidden, device="cuda", generator=gen)
    out = torch.randn(2048, hidden, device="cuda", generator=gen)
    served = triton_mhc.PROMPT_CHUNK, triton_mhc.PROMPT_WARPS
    reference = None
    for chunk, warps in PROMPT_VARIANTS:
        triton_mhc.PROMPT_CHUNK, triton_mhc.PROMPT_WARPS = chunk, warps

        def pre():
            return triton_mhc.hc_pre(streams, fn, base, scale, norm, 1e-6, 1e-6, 1e-6, 20)

        x, post, comb = pre()
        row = {"tokens": 2048, "prompt_chunk": chunk, "warps": warps, "hc_pre_us": graph_us(pre, 10, best=True)}
        row["hc_post_us"] = graph_us(lambda: triton_mhc.hc_post(streams, out, post, comb), 10, best=True)
        if reference is None:
            reference = x
        row["max_diff"] = float((x - reference).abs().max())
        result["rows"].append(row)
        print(row, flush=True)
    triton_mhc.PROMPT_CHUNK, triton_mhc.PROMPT_WARPS = served


def chained(fn, base, scale, norm, gen, tokens: int, result: dict) -> None:
    """One hyper-connection of a step as served (`_hc_mix` and a `_hc_post` that also makes the next map's sums,
    taking the sums the previous `_hc_post` made) against three launches (`_hc_dots`, `_hc_mix`, `_hc_post`): µs a
    sublayer, and whether both give the same bits."""
    n, hidden = 4, 4096
    before = torch.randn(tokens, n, hidden, device="cuda", generator=gen)
    out = torch.randn(tokens, hidden, device="cuda", generator=gen)
    args = (fn, base, scale, norm, 1e-6, 1e-6, 1e-6, 20)
    x, post, comb = triton_mhc.hc_pre(before, *args)
    streams, ahead = triton_mhc.hc_post(before, out, post, comb, fn)  # the previous sublayer's chained launch

    def three():
        x, post, comb = triton_mhc.hc_pre(streams, *args)
        return triton_mhc.hc_post(streams, out, post, comb)[0]

    def two():
        x, post, comb = triton_mhc.hc_pre(streams, *args, partials=ahead)
        return triton_mhc.hc_post(streams, out, post, comb, fn)

    row = {
        "tokens": tokens,
        "form": "chained",
        "three_launches_us": graph_us(three, CALLS, best=True),
        "two_launches_us": graph_us(two, CALLS, best=True),
        "same_bits": bool(torch.equal(three(), two()[0])),
    }
    result["rows"].append(row)
    print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--prompt", action="store_true", help="a 2,048-token prompt chunk's forms only")
    args = parser.parse_args()
    n, hidden = 4, 4096
    rows = 2 * n + n * n
    gen = torch.Generator(device="cuda").manual_seed(0)
    fn = torch.randn(rows, n * hidden, device="cuda", generator=gen) * 0.01
    base = torch.randn(rows, device="cuda", generator=gen) * 0.1
    scale = torch.rand(3, device="cuda", generator=gen)
    norm = torch.rand(hidden, device="cuda", generator=gen) + 0.5
    result: dict = {"calls": CALLS, "rows": []}
    served = triton_mhc.CHUNK, triton_mhc.DOTS_WARPS, triton_mhc.MIX_WARPS
    for tokens in () if args.prompt else (1, 4):
        streams = torch.randn(tokens, n, hidden, device="cuda", generator=gen)
        out = torch.randn(tokens, hidden, device="cuda", generator=gen)
        reference = None
        for chunk, dots_warps, mix_warps, iters in VARIANTS:
            triton_mhc.CHUNK, triton_mhc.DOTS_WARPS, triton_mhc.MIX_WARPS = chunk, dots_warps, mix_warps

            def pre(iters=iters):
                return triton_mhc.hc_pre(streams, fn, base, scale, norm, 1e-6, 1e-6, 1e-6, iters)

            x, post, comb = pre()
            row = {
                "tokens": tokens,
                "chunk": chunk,
                "dots_warps": dots_warps,
                "mix_warps": mix_warps,
                "iters": iters,
                "hc_pre_us": graph_us(pre, CALLS, best=True),
                "hc_post_us": graph_us(lambda: triton_mhc.hc_post(streams, out, post, comb), CALLS, best=True),
            }
            if reference is None:
                reference = (x, post, comb)
            elif iters == 20:
                row["max_diff"] = max(float((a - b).abs().max()) for a, b in zip((x, post, comb), reference))
            result["rows"].append(row)
            print(row, flush=True)
    triton_mhc.CHUNK, triton_mhc.DOTS_WARPS, triton_mhc.MIX_WARPS = served
    for tokens in () if args.prompt else (1, 4):
        chained(fn, base, scale, norm, gen, tokens, result)
    if args.prompt:
        prompt_chunk(fn, base, scale, norm, gen, result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
