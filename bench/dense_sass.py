"""Static analysis of the reduced dense products without a GPU: compile `triton_dense._dense_rows` for sm_90
(Triton's bundled ptxas) at the served weights' launches (`launch_shape`, the addresses aligned as Triton specialises
them), disassemble it (nvdisasm) and count its loops' instructions by opcode, a weight's share and the registers: the
loops with products, smallest first (one in this tree; branch s43-dense-unmasked has a second, a weight's last,
part-filled block's with its loads tested, after the one with none). A loop turn covers UNROLL groups of 64 inputs of
BLOCK_O outputs, so weights a thread a turn = BLOCK_O · 64 · UNROLL / (32 · warps).

    PYTHONPATH=. python bench/dense_sass.py [--names kda_in_proj,lm_head] [--tp 1] [--engine /tmp/old]

Counts are what the GPU must issue, not a timing: bench/dense_bench.py measures on the GPU.
"""

from __future__ import annotations

import argparse
import sys

from other_tree import from_argv

ENGINE = from_argv()  # --engine DIR: another checkout's engine (bench/other_tree.py)

import triton  # noqa: E402
from dense_bench import shapes  # noqa: E402
from exl3_sass import disassemble, loops, registers  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

from engine.ops import triton_dense as td  # noqa: E402


def compile_rows(out: int, width: int, fp8: bool, capability: int = 90, tiled: bool | None = None):
    """`_dense_rows` as dense_rows launches it for an [out, width] weight, its pointers, strides and output count
    16-aligned (Triton's specialisation of such arguments), its codes tiled as `quantize` keeps them (`tiled` None)
    or as `tiled` says; (kernel, launch)."""
    launch = td.launch_shape(out, width, 64, fp8)
    per_split = -(-width // launch["splits"] // 64) * 64
    const = dict(K=width, K_PER_SPLIT=per_split, SPLITS=launch["splits"], GROUP=64, FP8=fp8)
    const |= dict(BLOCK_O=launch["block_o"], ROWS=td.ROWS, KW=launch["kw"], WARPS=launch["num_warps"])
    const |= dict(UNROLL=launch["unroll"])
    fn = td._dense_rows
    if "SIGMA" in fn.arg_names:  # the MMA rows' order (since session 46; an --engine tree may predate it)
        const |= dict(SIGMA=launch["sigma"])
    if "TILE" in fn.arg_names:  # the codes tiled (since session 48)
        from engine.quant.dense import tiled_shape

        tile = td.TILE if (tiled_shape(out, width) if tiled is None else tiled) else 0
        const |= dict(TILE=tile)
    if "WHOLE_TILES" in fn.arg_names:  # a whole weight's blocks read from one base (session 49's table)
        const |= dict(WHOLE_TILES=td.whole_tiles(launch, 1, bool(const["TILE"])))  # as launched for one row
    pointers = {
        "x_ptr": "*fp32",
        "w_ptr": "*u8",
        "s_ptr": "*fp32" if fp8 else "*i32",  # q4: QuantWeight.words
        "out_ptr": "*fp32",
        "count_ptr": "*i32",
    }
    signature = {n: "constexpr" if n in const else pointers.get(n, "i32") for n in fn.arg_names}
    aligned = [n for n in fn.arg_names if n in pointers or n.startswith("stride") or (n == "OUT" and out % 16 == 0)]
    source = GluonASTSource(
        fn=fn,
        signature=signature,
        constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
        attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned},
    )
    kernel = triton.compile(
        source, target=GPUTarget("cuda", capability, 32), options={"num_warps": launch["num_warps"]}
    )
    return kernel, launch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--names", default="kda_in_proj,kda_o_proj,dsa_q_b,shared_gate_up,lm_head")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tiled", choices=("rule", "rows", "tiled"), default="rule", help="the codes' layout")
    args = ap.parse_args()
    tiled = None if args.tiled == "rule" else args.tiled == "tiled"
    print(f"engine: {ENGINE or 'this checkout'}")
    for name in args.names.split(","):
        out, width = shapes(args.tp)[name]
        for fp8 in (False, True):
            kernel, launch = compile_rows(out, width, fp8, tiled=tiled)
            sass, usage = disassemble(kernel)
            weights = launch["block_o"] * 64 * launch["unroll"] / (32 * launch["num_warps"])
            with_products = [ops for ops in loops(sass) if ops.get("HMMA")]  # the split sum's loop has none
            for which, ops in zip(("loop", "second loop"), with_products[:2]):
                total = sum(ops.values())
                top = ", ".join(f"{op} {n}" for op, n in ops.most_common(8))
                print(
                    f"{name} {out}x{width} {'fp8' if fp8 else 'q4'} {which}: {total} loop instructions, "
                    f"{total / weights:.2f} a weight, {registers(usage)} registers | {top}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
