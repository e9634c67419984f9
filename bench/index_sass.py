"""Static analysis of DSA's indexer kernel (engine/ops/triton_dsa.py `_index_scores`) without a GPU: each form the
engine launches, compiled for sm_90 (Triton's bundled ptxas; its nvdisasm does not read sm_121) and disassembled.
Counted: the query loop's instructions (the loop a prompt chunk's program runs once a query, over BP pools; a
decode step's program, one query, whole), registers, local stack (spills), shared memory, the warps an SM can hold
by those, and the instructions and tensor-core instructions a (query, pool) pair costs.

    PYTHONPATH=.:bench python bench/index_sass.py [--pools 64,128] [--warps 4,8] [--out FILE]

The forms: a prompt chunk's keys as an fp32 tensor (tf32x3; what every prompt chunk ran before session 31), a bf16
cache pool's in place against q's three bf16 parts made for the launch, an fp8 pool's as a bf16 copy with their
scales; two forms left out for what these counts showed (an fp8 pool's keys converted inside the kernel, q split
inside the kernel once a program); and a decode step's forms (a query a program, its own keys in place; a bf16
pool's as tf32x3 products too, its form before session 31). Counts are what the GPU must issue, not a timing:
bench/dsa_prompt_bench.py --index times them on a GPU.
"""

from __future__ import annotations

import argparse
import json
import re

import triton
from exl3_sass import disassemble, opcodes, registers
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.ops import triton_dsa

SIGNATURE = {
    "q_ptr": "*fp32", "k_ptr": "*fp32", "w_ptr": "*fp32", "pos_ptr": "*i64", "out_ptr": "*fp32", "T": "i32",
    "P": "i32", "scale": "fp32", "slot_ptr": "*i64", "scl_ptr": "*fp32", "row_stride": "i32",
}  # fmt: skip
CHUNK = {"QB": triton_dsa.INDEX_LAUNCH["queries"], "SHARED": True, "PARTS": False}
STEP = {"QB": 1, "SHARED": False, "PARTS": False}
# name: (q, keys, constexprs); every form at the served shapes (32 heads of 128, pools of 16)
FORMS = {
    "chunk, fp32 keys (tf32x3; before)": ("*fp32", "*fp32", {**CHUNK, "GATHER": False, "SCALED": False, "SPLIT": False}),
    "chunk, bf16 pool in place, q parts": ("*bf16", "*bf16", {**CHUNK, "GATHER": True, "SCALED": False, "SPLIT": True,
                                                               "PARTS": True}),
    "chunk, fp8 pool as bf16 + scales, q parts": ("*bf16", "*bf16", {**CHUNK, "GATHER": False, "SCALED": True,
                                                                      "SPLIT": True, "PARTS": True}),
    "(left out) chunk, fp8 pool in place, q parts": ("*bf16", "*fp8e4nv", {**CHUNK, "GATHER": True, "SCALED": True,
                                                                            "SPLIT": True, "PARTS": True}),
    "(left out) chunk, bf16 pool, q split a program": ("*fp32", "*bf16", {**CHUNK, "GATHER": True, "SCALED": False,
                                                                           "SPLIT": True}),
    "step, fp32 pool in place": ("*fp32", "*fp32", {**STEP, "GATHER": True, "SCALED": False, "SPLIT": False}),
    "step, bf16 pool in place, tf32x3 (before)": ("*fp32", "*bf16", {**STEP, "GATHER": True, "SCALED": False,
                                                                      "SPLIT": False}),
    "step, bf16 pool in place": ("*fp32", "*bf16", {**STEP, "GATHER": True, "SCALED": False, "SPLIT": True}),
    "step, fp8 pool in place": ("*fp32", "*fp8e4nv", {**STEP, "GATHER": True, "SCALED": True, "SPLIT": True}),
}  # fmt: skip
REGISTERS_PER_SM, SHARED_PER_SM = 65_536, 233_472  # an H100's / H200's SM


def compile_form(q: str, keys: str, constexprs: dict, pools: int, warps: int):
    fn = triton_dsa._index_scores
    signature = {n: SIGNATURE.get(n, "constexpr") for n in fn.arg_names} | {"q_ptr": q, "k_ptr": keys}
    values = {"KPOOL": 16, "H": 32, "D": 128, "BP": pools, "PRECISION": "tf32x3", "WIDEN": False, **constexprs}
    pointers = [i for i, n in enumerate(fn.arg_names) if signature[n].startswith("*")]
    source = ASTSource(
        fn=fn,
        signature=signature,
        constexprs={(fn.arg_names.index(n),): v for n, v in values.items()},
        attrs={(i,): [("tt.divisibility", 16)] for i in pointers},
    )
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


def query_loop(sass: str) -> str:
    """The loop with the most tensor-core instructions (a chunk's loop over its queries); the whole kernel where there
    is no loop (a decode step's program: one query)."""
    lines = sass.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:$", line)}
    best, most = sass, 0
    for j, line in enumerate(lines):
        found = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if found and labels.get(found.group(1), j) < j:
            body = "\n".join(lines[labels[found.group(1)] : j + 1])
            if opcodes(body).get("HMMA", 0) > most:
                best, most = body, opcodes(body)["HMMA"]
    return best


def analyse(name: str, pools: int, warps: int) -> dict:
    q, keys, constexprs = FORMS[name]
    kernel = compile_form(q, keys, constexprs, pools, warps)
    sass, usage = disassemble(kernel)
    ops = opcodes(query_loop(sass))
    regs = registers(usage) or 0
    stack = re.search(r"STACK:(\d+)", usage)
    shared = kernel.metadata.shared
    blocks = min(REGISTERS_PER_SM // max(regs * 32 * warps, 1), SHARED_PER_SM // max(shared, 1))
    per_pair = warps / pools  # each warp issues the loop once a query; a program covers BP pools
    return {
        "pools": pools,
        "warps": warps,
        "registers": regs,
        "stack_bytes": int(stack.group(1)) if stack else None,
        "shared_bytes": shared,
        "warps_per_sm": min(64, blocks * warps),
        "loop_instructions": sum(ops.values()),
        "instructions_per_query_pool": round(sum(ops.values()) * per_pair, 1),
        "mma_per_query_pool": round(ops.get("HMMA", 0) * per_pair, 2),
        "top": dict(ops.most_common(6)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pools", default=str(triton_dsa.INDEX_LAUNCH["pools"]), help="pools a program (BP)")
    ap.add_argument("--warps", default=str(triton_dsa.INDEX_LAUNCH["num_warps"]))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for pools in map(int, args.pools.split(",")):
        for warps in map(int, args.warps.split(",")):
            for name in FORMS:
                row = {"form": name, **analyse(name, pools, warps)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"arch": "sm_90", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
