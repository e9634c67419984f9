"""What programmatic dependent launch (PDL) saves a chain of short kernels in a CUDA graph (GPU, sm_90+).

A decode step is a graph of ~60 kernels a layer, many of them a few microseconds long, so a kernel's start and
end (its blocks scheduled, the last wave drained, the next kernel's blocks launched) weigh on the step. With PDL a
kernel launched with `launch_pdl=True` may be scheduled while the kernel before it still runs; its `gdc_wait()`
holds it until that kernel's memory is visible. This bench times a chain of such kernels in one graph, three ways:
plain launches; PDL with `gdc_wait()` first; PDL with `gdc_launch_dependents()` then `gdc_wait()` first (the next
kernel may start its launch as soon as every program of this one has begun). Shapes: one program over 16 KB (a
norm's or a router's size), 132 programs over 2 MB, 528 programs over 16 MB (a small GEMV's read). Each chain's
result is checked against the plain chain's (the same bits: the kernels only add).

    python bench/pdl_bench.py [--kernels 200] [--replays 20] [--out FILE]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _step(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    if EARLY:
        gdc_launch_dependents()
    if PDL:
        gdc_wait()
    start = tl.program_id(0) * BLOCK
    for i in range(start, start + BLOCK, 1024):
        at = i + tl.arange(0, 1024)
        tl.store(y_ptr + at, tl.load(x_ptr + at, mask=at < n) + 1.0, mask=at < n)


SHAPES = {"1 program, 16 KB": (1, 4096), "132 programs, 2 MB": (132, 4096), "528 programs, 16 MB": (528, 8192)}
MODES = {"plain": (False, False), "pdl wait": (True, False), "pdl early + wait": (True, True)}


def chain(programs: int, block: int, kernels: int, replays: int, pdl: bool, early: bool) -> tuple[float, torch.Tensor]:
    n = programs * block
    a = torch.zeros(n, device="cuda")
    b = torch.zeros(n, device="cuda")

    def launch() -> None:
        for k in range(kernels):
            src, dst = (a, b) if k % 2 == 0 else (b, a)
            _step[(programs,)](src, dst, n, BLOCK=block, PDL=pdl, EARLY=early, num_warps=4, launch_pdl=pdl)

    launch()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    a.zero_()
    b.zero_()
    graph.replay()
    torch.cuda.synchronize()
    result = (a if kernels % 2 == 0 else b).clone()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / (replays * kernels))
    return sorted(times)[1], result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=200)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), f"triton {triton.__version__}")
    found: dict[str, dict[str, float]] = {}
    for shape, (programs, block) in SHAPES.items():
        found[shape] = {}
        plain = None
        for mode, (pdl, early) in MODES.items():
            us, result = chain(programs, block, args.kernels, args.replays, pdl, early)
            if plain is None:
                plain = result
                assert torch.all(result == args.kernels), "the chain's sum"
            assert torch.equal(result, plain), f"{shape} {mode}: not the plain chain's result"
            found[shape][mode] = round(us, 3)
            print(f"{shape:>22}  {mode:>17}: {us:7.3f} µs a kernel")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "kernels": args.kernels, "us_a_kernel": found}, f)


if __name__ == "__main__":
    main()
