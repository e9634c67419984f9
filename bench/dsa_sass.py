"""Static analysis of DSA's kernels without a GPU (engine/ops/triton_dsa.py): each form the engine launches, compiled
for sm_90 (Triton's bundled ptxas; its nvdisasm does not read sm_121) and disassembled. Counted: the main loop's
instructions, tensor-core instructions and local-memory (spill) accesses, registers, local stack, shared memory, and
the warps an SM can hold by those.

    PYTHONPATH=.:bench python bench/dsa_sass.py [--kernel index,attend,lane] [--pools 64,128] [--warps 4,8]
        [--wide] [--out FILE]

The indexer (`_index_scores`; the loop a prompt chunk's program runs once a query over BP pools, per (query, pool)
pair; a decode step's program, one query, whole): a chunk's keys as an fp32 tensor (tf32x3; what every prompt chunk
ran before session 31), a bf16 cache pool's in place against q's three bf16 parts made for the launch, an fp8 pool's
as a bf16 copy with their scales; two forms left out for what these counts showed (an fp8 pool's keys converted
inside the kernel, q split inside the kernel once a program); and a decode step's forms (a query a program, its own
keys in place; a bf16 pool's as tf32x3 products too, its form before session 31).

The selected-token attention (`_attend_prompt`, the H200's launches and the other GPUs' — those compiled for sm_89,
the GB10's stand-in —; the loop a program runs once a block of a query's selected tokens): latents from a bf16 pool
in place, an fp8 pool's in place (e4m3 converted in the kernel) and as a bf16 copy with their scales, and with a lo
part (an fp32 pool's).

A decode step's lane attention (`_attend_part`, a program a row's block of 32 selected tokens, whole): its latents
as an fp32 copy gathered from the pool (before session 31), and read by slot from a bf16 and an fp8 pool.

Counts are what the GPU must issue, not a timing: bench/dsa_prompt_bench.py times the prompt kernels on a GPU.
"""

from __future__ import annotations

import argparse
import json
import re

import triton
from dsa_prompt_bench import GB10_BEFORE
from exl3_sass import disassemble, opcodes, registers
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.ops import triton_dsa

INDEX_SIGNATURE = {
    "q_ptr": "*fp32", "k_ptr": "*fp32", "w_ptr": "*fp32", "pos_ptr": "*i64", "out_ptr": "*fp32", "T": "i32",
    "P": "i32", "scale": "fp32", "slot_ptr": "*i64", "scl_ptr": "*fp32", "row_stride": "i32",
}  # fmt: skip
CHUNK = {"QB": triton_dsa.INDEX_LAUNCH["queries"], "SHARED": True, "PARTS": False}
STEP = {"QB": 1, "SHARED": False, "PARTS": False}
# name: (q, keys, constexprs); every form at the served shapes (32 heads of 128, pools of 16)
INDEX_FORMS = {
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
ATTEND_SIGNATURE = {
    "qh_ptr": "*bf16", "ql_ptr": "*bf16", "tok_ptr": "*i64", "cnt_ptr": "*u8", "out_ptr": "*bf16", "lo_out_ptr": "*bf16",
    "T": "i32",
    "lat_stride": "i32", "scl_ptr": "*fp32",
}  # fmt: skip
# name: (latents, constexprs), at TP=2's share of the served layer (32 heads, rank 512, 2,052 tokens a query)
ATTEND_FORMS = {
    "bf16 pool in place": ("*bf16", {"HAS_LO": False, "FP8": False}),
    "fp8 pool in place, e4m3 converted in the kernel": ("*fp8e4nv", {"HAS_LO": False, "FP8": True}),
    "fp8 pool as a bf16 copy + scales": ("*bf16", {"HAS_LO": False, "FP8": True}),
    "fp32 pool, hi and lo parts": ("*bf16", {"HAS_LO": True, "FP8": False}),
}
LANE_SIGNATURE = {
    "q_ptr": "*fp32", "cnt_ptr": "*u8", "part_ptr": "*fp32", "stat_ptr": "*fp32", "scaling": "fp32", "N": "i32",
    "slot_ptr": "*i64", "scl_ptr": "*fp32", "row_stride": "i32",
}  # fmt: skip
# name: (latents, constexprs), a decode step's row at TP=2's share (32 heads, rank 512, 2,068 selected tokens)
LANE_FORMS = {
    "gathered fp32 latents (before)": ("*fp32", {"GATHER": False, "FP8": False}),
    "bf16 pool in place": ("*bf16", {"GATHER": True, "FP8": False}),
    "fp8 pool in place": ("*fp8e4nv", {"GATHER": True, "FP8": True}),
}
REGISTERS_PER_SM, SHARED_PER_SM = 65_536, 233_472  # an H100's / H200's SM
WIDE = [False]  # --wide: `_attend_prompt` with 64-bit latent offsets (its form before session 35; served past 2^31)


def compile_kernel(fn, signature: dict, values: dict, warps: int, stages: int = 3, arch: int = 90):
    """`fn` compiled for sm_`arch`, the arguments not in `signature` constexprs: every pointer 16-byte aligned and
    every integer a multiple of 16, as Triton specialises the served launches (a 2,048-token chunk, spans of whole
    256-token blocks, rows of 768 or 512 values)."""
    signature = {n: signature.get(n, "constexpr") for n in fn.arg_names}
    source = ASTSource(
        fn=fn,
        signature=signature,
        constexprs={(fn.arg_names.index(n),): v for n, v in values.items()},
        attrs={(i,): [("tt.divisibility", 16)] for i, n in enumerate(fn.arg_names) if signature[n][0] in "*i"},
    )
    options = {"num_warps": warps, "num_stages": stages}
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def main_loop(sass: str) -> str:
    """The loop with the most tensor-core instructions (HMMA, or Hopper's HGMMA); the whole kernel where there is no
    such loop (a decode step's indexer program: one query)."""
    lines = sass.splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.match(r"^\.L_x_\d+:$", line)}
    best, most = sass, 0
    for j, line in enumerate(lines):
        found = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if found and labels.get(found.group(1), j) < j:
            body = "\n".join(lines[labels[found.group(1)] : j + 1])
            ops = opcodes(body)
            if ops.get("HMMA", 0) + ops.get("HGMMA", 0) > most:
                best, most = body, ops.get("HMMA", 0) + ops.get("HGMMA", 0)
    return best


def counts(kernel, warps: int) -> dict:
    sass, usage = disassemble(kernel)
    ops = opcodes(main_loop(sass))
    regs = registers(usage) or 0
    stack = re.search(r"STACK:(\d+)", usage)
    shared = kernel.metadata.shared
    blocks = min(REGISTERS_PER_SM // max(regs * 32 * warps, 1), SHARED_PER_SM // max(shared, 1))
    return {
        "warps": warps,
        "registers": regs,
        "stack_bytes": int(stack.group(1)) if stack else None,
        "shared_bytes": shared,
        "warps_per_sm": min(64, blocks * warps),
        "loop_instructions": sum(ops.values()),
        "loop_tensor_core": ops.get("HMMA", 0) + ops.get("HGMMA", 0),
        "loop_local": ops.get("STL", 0) + ops.get("LDL", 0),
        "top": dict(ops.most_common(6)),
    }


def index_form(name: str, pools: int, warps: int) -> dict:
    q, keys, constexprs = INDEX_FORMS[name]
    values = {"KPOOL": 16, "H": 32, "D": 128, "BP": pools, "PRECISION": "tf32x3", "WIDEN": False, **constexprs}
    kernel = compile_kernel(triton_dsa._index_scores, INDEX_SIGNATURE | {"q_ptr": q, "k_ptr": keys}, values, warps)
    found = counts(kernel, warps)
    per_pair = warps / pools  # each warp issues the loop once a query; a program covers BP pools
    found["instructions_per_query_pool"] = round(found["loop_instructions"] * per_pair, 1)
    found["mma_per_query_pool"] = round(found["loop_tensor_core"] * per_pair, 2)
    return {"kernel": "index", "form": name, "pools": pools, **found}


def attend_form(name: str, capability: tuple[int, int] = (9, 0), over: dict | None = None) -> dict:
    """A form of `_attend_prompt` as a GPU of `capability` launches it (with `over`'s changes to the launch), compiled
    for that GPU — or, for (12, 1), for sm_89: the GB10's stand-in (the same mma.sync code; this nvdisasm does not
    read sm_121)."""
    latents, constexprs = ATTEND_FORMS[name]
    launch = {**triton_dsa.prompt_launch(capability, constexprs["HAS_LO"]), **(over or {})}
    values = {"N": 2052, "H": 32, "HG": triton_dsa.head_group(launch, 32), "R": 512, "BT": launch["block"]}
    values |= {"WIDEN": False, "WIDE": WIDE[0], "SPLIT_OUT": True, "HEADS_M": launch["heads_m"], **constexprs}
    signature = ATTEND_SIGNATURE | {"hi_ptr": latents, "lo_ptr": latents}
    arch = 90 if capability == (9, 0) else 89
    kernel = compile_kernel(
        triton_dsa._attend_prompt, signature, values, launch["num_warps"], launch["num_stages"], arch
    )
    found = counts(kernel, launch["num_warps"])
    shape = {"tokens_a_block": launch["block"], "heads_m": launch["heads_m"]}
    return {"kernel": "attend", "form": name, "arch": f"sm_{arch}", **shape, **found}


def lane_form(name: str) -> dict:
    latents, constexprs = LANE_FORMS[name]
    blocks = -(-2068 // triton_dsa.BLOCK)
    values = {"BLOCKS": blocks, "H": 32, "HP": 32, "R": 512, "BN": triton_dsa.BLOCK, "RC": triton_dsa.SLICE}
    kernel = compile_kernel(triton_dsa._attend_part, LANE_SIGNATURE | {"lat_ptr": latents}, values | constexprs, 4)
    return {"kernel": "lane", "form": name, **counts(kernel, 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="index,attend,lane")
    ap.add_argument("--pools", default=str(triton_dsa.INDEX_LAUNCH["pools"]), help="the indexer's pools a program")
    ap.add_argument("--warps", default=str(triton_dsa.INDEX_LAUNCH["num_warps"]), help="the indexer's warps")
    ap.add_argument("--out", default=None)
    ap.add_argument("--wide", action="store_true", help="the prompt attention with 64-bit latent offsets")
    args = ap.parse_args()
    WIDE[0] = args.wide
    rows = []
    if "index" in args.kernel:
        for pools in map(int, args.pools.split(",")):
            for warps in map(int, args.warps.split(",")):
                rows += [index_form(name, pools, warps) for name in INDEX_FORMS]
    if "attend" in args.kernel:
        rows += [attend_form(name) for name in ATTEND_FORMS]
        rows += [attend_form(name, (12, 1)) for name in ATTEND_FORMS]
        # the GB10's launch before session 42: the tokens as the products' tall side, 8 warps
        before = {"heads_m": False, **GB10_BEFORE}
        rows += [{**attend_form(name, (12, 1), before), "launch": "before"} for name in ATTEND_FORMS]
    if "lane" in args.kernel:
        rows += [lane_form(name) for name in LANE_FORMS]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"arch": "sm_90 unless a row says otherwise", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
