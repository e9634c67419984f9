"""Issue 20's mul1 defect on the GPU: the EXL3 GEMV's partial sums against the exact CPU product (xp @ W_q, W_q from
engine/quant/exl3.unpack), for the mul1 codebook at widths 5 and 3.5 (and controls), over launch shapes, with the
kernel's mul1 decode as it is (V0) and rewritten in a few equivalent forms (V1..V4) to find one the compiler gets
right everywhere. Writes JSON.

    python bench/exl3_mul1_probe.py --out FILE
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.quant import exl3  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter (TRITON_INTERPRET=1) on the CPU

ORIGINAL = """        x = state * 0x83DCD12D
        byte_sum = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)
        # 2^23 + (1024 + byte_sum) as fp32 bits, less 2^23: the integer as fp32 without a conversion
        count = (0x4B000400 + byte_sum).to(tl.float32, bitcast=True) - 8388608.0
        value = (count * MUL1_SCALE + MUL1_BIAS).to(tl.float16).to(tl.float32)  # exact in fp32, one rounding
"""
VARIANTS = {
    "V0": ORIGINAL,
    "V1_mask_top": ORIGINAL.replace("+ (x >> 24)", "+ ((x >> 24) & 255)"),
    "V2_convert": ORIGINAL.replace(
        "count = (0x4B000400 + byte_sum).to(tl.float32, bitcast=True) - 8388608.0",
        "count = (1024 + byte_sum).to(tl.float32)",
    ),
    "V3_uint32": ORIGINAL.replace("x = state * 0x83DCD12D", "x = (state.to(tl.uint32) * 0x83DCD12D).to(tl.uint32)"),
    "V4_no_fma": ORIGINAL.replace(
        "value = (count * MUL1_SCALE + MUL1_BIAS)", "value = (tl.fma(count, MUL1_SCALE, MUL1_BIAS))"
    ),
}


def load_variant(name: str, text: str):
    source = (ROOT / "engine/ops/triton_exl3.py").read_text()
    assert ORIGINAL in source
    path = Path(tempfile.mkdtemp()) / f"exl3_{name}.py"
    path.write_text(source.replace(ORIGINAL, text))
    spec = importlib.util.spec_from_file_location(f"exl3_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    k = n = 512
    results = []
    for name in args.variants.split(","):
        mod = load_variant(name, VARIANTS[name])
        for (bits, codebook), rows, (bnt, unroll, warps) in itertools.product(
            [(5, "mul1"), (3.5, "mul1"), (5, "mcg")],
            [1, 2],
            [(None, None, None), (8, None, None), (None, 1, None)],
        ):
            gen = torch.Generator().manual_seed(int(bits * 10) + rows)
            trellis = torch.randint(-32768, 32768, (1, k // 16, n // 16, int(16 * bits)), generator=gen).to(torch.int16)
            wq = exl3.unpack(trellis[0], codebook).double()
            xp = torch.randn(1, rows, k, generator=gen)
            xin = xp.clone()
            xk = mod.kernel_order(xin)  # the kernel reads xk; its product is xin @ wq
            parts = mod.exl3_gemv_parts(
                xk.to(DEVICE), trellis.to(DEVICE), torch.zeros(1, dtype=torch.int32, device=DEVICE), codebook,
                block_n_tiles=bnt, unroll=unroll, num_warps=warps,
            )  # fmt: skip
            got = parts.sum(0)[0].double().cpu()
            ref = xin[0].double() @ wq
            rel = float((got - ref).abs().max() / ref.abs().max())
            row = {"variant": name, "bits": bits, "codebook": codebook, "rows": rows, "bnt": bnt, "unroll": unroll,
                   "warps": warps, "rel_error": rel, "ok": rel < 1e-5}  # fmt: skip
            results.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
