"""Static analysis of the EXL3 decode-GEMV without a GPU: compile `_exl3_gemv` for sm_90 (Triton's bundled ptxas),
disassemble it (nvdisasm) and count the instructions of its main loop by opcode, the barriers (a shared-memory layout
conversion inside the loop shows up as BAR.SYNC) and the registers. Weights per loop iteration per thread =
KU · 256 · BNT / (32 · warps), so instructions a weight = loop instructions / that.

    PYTHONPATH=. python bench/exl3_sass.py [--rows 1,8] [--bnt 8] [--warps 4] [--no-asm]
    PYTHONPATH=. python bench/exl3_sass.py --grouped   # a prompt chunk's `_exl3_grouped_wgmma`, PROMPT_LAUNCH's forms

With --grouped: the warpgroup form at the served gate‖up shape (K 4096, TP=2's 1,024 outputs, 64 pairs a block on
4 warps and 128 on 8), with PROMPT_LAUNCH's ring and register cap and without the cap: its largest loop (one turn of
the ring), instructions a K tile, barriers, registers, shared memory and the programs an SM holds by them.

Counts are what the GPU must issue, not a timing: bench/exl3_bench.py measures on the GPU.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource

from engine.ops import triton_exl3 as tx

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_gemv(
    rows: int, bnt: int, warps: int, unroll: int, asm: bool, k_tiles: int = 256, n_tiles: int = 128, form: str = "fma"
):
    fn = tx._exl3_gemv_mma if form == "mma" else tx._exl3_gemv
    pointers = {"x_ptr": "*fp32", "t_ptr": "*i32", "mat_ptr": "*i32", "out_ptr": "*fp32"}
    const = dict(
        K_TILES=k_tiles,
        N_TILES=n_tiles,
        WORDS=32,
        BITS2=8,
        CODEBOOK=1,
        ROWS=rows,
        BNT=bnt,
        SPLIT=4,
        KU=unroll,
        MUL1_SCALE=tx._MUL1_SCALE,
        MUL1_BIAS=tx._MUL1_BIAS,
        ASM=asm,
        PAIRED=False,
    )
    if form == "mma":
        const["WARPS"] = warps
    signature = {n: pointers.get(n, "constexpr") for n in fn.arg_names}
    constexprs = {(fn.arg_names.index(k),): v for k, v in const.items()}
    if form == "mma":  # a Gluon kernel
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in pointers}
        src = GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    else:
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def disassemble(kernel) -> tuple[str, str]:
    """A compiled kernel's SASS (nvdisasm) and its resource usage (cuobjdump: registers, stack, shared memory)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        sass = subprocess.run(
            [os.path.join(TOOLS, "nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True
        ).stdout
        usage = subprocess.run(
            [os.path.join(TOOLS, "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
    finally:
        os.unlink(f.name)
    return sass, usage


def opcodes(sass: str) -> collections.Counter:
    """The instructions of SASS text by opcode (without modifiers or predicates)."""
    ops: collections.Counter = collections.Counter()
    for line in sass.splitlines():
        if not re.search(r"/\*[0-9a-f]{4,}\*/", line):
            continue
        words = line.split("*/", 1)[1].replace("{", " ").split()
        if words:
            op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
            ops[op.split(".")[0]] += 1
    return ops


def registers(usage: str) -> int | None:
    found = re.search(r"REG:(\d+)", usage)
    return int(found.group(1)) if found else None


def analyse(kernel) -> dict:
    sass, usage = disassemble(kernel)
    loop = sass.split(".L_x_0:", 1)[1].split("BRA", 1)[0] if ".L_x_0:" in sass else ""
    ops = opcodes(loop)
    return {
        "loop_instructions": sum(ops.values()),
        "loop_barriers": ops.get("BAR", 0),
        "registers": registers(usage),
        "ops": dict(ops.most_common()),
    }


def loops(sass: str) -> list[collections.Counter]:
    """The opcodes of every loop in SASS text (a label and the backward branch to it), smallest first."""
    found = []
    for label in re.finditer(r"(\.L_x_\d+):", sass):
        body = sass[label.end() :]
        end = body.find(f"BRA `({label.group(1)})")
        if end > 0:
            found.append(opcodes(body[:end]))
    return sorted(found, key=lambda ops: sum(ops.values()))


def largest_loop(sass: str) -> collections.Counter:
    """The opcodes of the largest loop in SASS text (a label and the backward branch to it)."""
    return max(loops(sass), key=lambda ops: sum(ops.values()), default=collections.Counter())


def grouped(bm: int, warps: int, maxnreg: int | None) -> dict:
    """`_exl3_grouped_wgmma` compiled for sm_90 at the gate‖up shape, PROMPT_LAUNCH's ring, under a register cap."""
    fn = tx._exl3_grouped_wgmma
    ring = {"KB": tx.PROMPT_LAUNCH["stage_tiles"], "STAGES": tx.PROMPT_LAUNCH["stages"]}
    const = dict(K_TILES=256, N_TILES=64, WORDS=32, BITS2=8, CODEBOOK=1, BM=bm, BNT=8, MATS=2, SCATTER=False)
    const |= dict(SPLIT_X=True, WARPS=warps, N_FIRST=True, MUL1_SCALE=tx._MUL1_SCALE, MUL1_BIAS=tx._MUL1_BIAS)
    const |= dict(ASM=True, **ring)
    pointers = {"xh_ptr": "*fp16", "xl_ptr": "*fp16", "t_ptr": "*i32", "block_ptr": "*i32", "dest_ptr": "*i32"}
    pointers["out_ptr"] = "*fp32"
    source = GluonASTSource(
        fn=fn,
        signature={n: pointers.get(n, "constexpr") for n in fn.arg_names},
        constexprs={(fn.arg_names.index(k),): v for k, v in const.items()},
        attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in pointers},
    )
    options = {"num_warps": warps} | ({} if maxnreg is None else {"maxnreg": maxnreg})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    sass, usage = disassemble(kernel)
    ops = largest_loop(sass)
    tiles = ring["KB"] * ring["STAGES"]
    regs = registers(usage) or 0
    programs = min(65536 // (regs * 32 * warps), 228 * 1024 // max(kernel.metadata.shared, 1))
    return {
        "per_tile": sum(ops.values()) / tiles,
        "barriers_per_tile": ops.get("BAR", 0) / tiles,
        "registers": regs,
        "stack": int(m.group(1)) if (m := re.search(r"STACK:(\d+)", usage)) else None,
        "shared": kernel.metadata.shared,
        "programs_an_sm": programs,
        "ops": dict(ops.most_common(12)),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grouped", action="store_true", help="the prompt chunk's warpgroup form instead")
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--bnt", default="8")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--unroll", type=int, default=2)
    parser.add_argument("--no-asm", action="store_true")
    parser.add_argument("--form", default="fma", choices=("fma", "mma"), help="_exl3_gemv or _exl3_gemv_mma")
    args = parser.parse_args()
    if args.grouped:
        for bm, warps in ((64, 4), (128, 8)):
            for cap in (tx.PROMPT_LAUNCH["wgmma_maxnreg"], None):
                print(f"{bm} pairs, {warps} warps, register cap {cap}: {grouped(bm, warps, cap)}")
        return 0
    for rows in map(int, args.rows.split(",")):
        for bnt in map(int, args.bnt.split(",")):
            found = analyse(compile_gemv(rows, bnt, args.warps, args.unroll, not args.no_asm, form=args.form))
            weights = args.unroll * 256 * bnt / (32 * args.warps)
            print(
                f"rows {rows} tiles {bnt} warps {args.warps}: {found['loop_instructions']} loop instructions "
                f"({found['loop_instructions'] / weights:.2f} a weight), {found['loop_barriers']} barriers, "
                f"{found['registers']} registers; {found['ops']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
