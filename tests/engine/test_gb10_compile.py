"""Every engine Triton kernel compiles for the GB10 (sm_121) on this machine, without the GPU: Triton's CUDA backend
and its bundled ptxas produce a cubin for GPUTarget("cuda", 121, 32) (FACTS.md). What is compiled is what the GPU
tests compiled on the H200 — signatures, constexprs, divisibility attributes and launch options, recorded in
tests/fixtures/triton_launches.json by bench/record_triton_launches.sh — two specialisations a kernel (the first
and the last recorded, which differ in rows, widths or formats). A kernel launched in engine/ops with no record
fails the test: record again after adding one. Each compiled kernel's shared memory must fit the GB10's per-block
limit: Triton checks it only when the kernel loads on the device, so a tile that fits the H200's 227 KB would first
fail on a Spark. What this cannot show without a GB10: speed, and that the cubin runs (the test bed has no sm_121
device); docs/OPERATIONS.md lists the rest."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCHES = ROOT / "tests" / "fixtures" / "triton_launches.json"
LAUNCH_SITE = re.compile(r"\b(_[a-z_0-9]+)\[[^\]\n]*\]\(")
# shared memory one block may take on compute capability 12.x (the opt-in maximum; Triton's "Hardware limit: 101376"
# on sm_12x parts), against 232,448 on the H200
GB10_SHARED_PER_BLOCK = 101_376


# kernels whose every recorded specialisation is compiled (not only the first and last): DSA's prompt attention, whose
# GB10 forms (bf16, e4m3 in place, a lo part) take its launch's shared memory differently
EVERY_FORM = {"_attend_prompt"}


def _entries() -> list[dict]:
    chosen: dict[str, list[dict]] = {}
    for entry in json.loads(LAUNCHES.read_text()):
        chosen.setdefault(f"{entry['module']}.{entry['kernel']}", []).append(entry)
    return [
        e
        for group in chosen.values()
        for e in (group if group[0]["kernel"] in EVERY_FORM else [group[0], group[-1]] if len(group) > 1 else group)
    ]


def test_every_launched_kernel_has_a_recorded_specialisation():
    launched = set()
    for path in (ROOT / "engine" / "ops").glob("triton_*.py"):
        source = path.read_text()
        jitted = set(re.findall(r"@triton\.jit\s*\ndef (\w+)", source))
        launched |= {f"engine.ops.{path.stem}.{name}" for name in LAUNCH_SITE.findall(source) if name in jitted}
    recorded = {f"{e['module']}.{e['kernel']}" for e in json.loads(LAUNCHES.read_text())}
    assert launched and launched <= recorded, (
        f"not recorded (run bench/record_triton_launches.sh): {launched - recorded}"
    )


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: f"{e['kernel']}-{e['num_warps']}w")
def test_kernel_compiles_for_sm121(entry):
    _compile_for_sm121(entry)


def _derived(fn, match, what: str, values=None, **signature: str) -> dict:
    """A launch derived from the first recorded one of kernel `fn` whose constexprs (by name) satisfy `match`: its
    constexprs updated with `values` (a dict, or a function of the recorded ones giving it; None: left out) and its
    signature with `signature`, for a form that runs now but that the record may predate or leave out. Fails, naming
    `what`, where none is recorded."""
    names = fn.arg_names
    for entry in json.loads(LAUNCHES.read_text()):
        recorded = _constexprs(entry, names) if entry["kernel"] == fn.__name__ else {}
        if recorded and match(recorded):
            break
    else:
        pytest.fail(f"no {what} recorded (run bench/record_triton_launches.sh)")
    changes = values(recorded) if callable(values) else values or {}
    constexprs = {n: v for n, v in {**recorded, **changes}.items() if v is not None}
    return {**entry, "signature": {**entry["signature"], **signature}, "constexprs": _as_recorded(constexprs, names)}


def test_the_prompt_chunk_hyper_connection_mix_compiles_for_sm121():
    """The prompt-chunk form of `_hc_mix` (GRAM: one program a token over the whole width) as it is launched now —
    the recorded one with triton_mhc.PROMPT_CHUNK columns a step and PROMPT_WARPS warps (the record may be of an
    earlier step) —, which `_entries` leaves out: neither the first nor the last `_hc_mix` recorded."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from engine.ops import triton_mhc

    chunk = triton_mhc.PROMPT_CHUNK
    values = lambda v: {"BLOCK": chunk, "SPAN": -(-v["HIDDEN"] // chunk)}  # noqa: E731
    entry = _derived(triton_mhc._hc_mix, lambda v: v.get("GRAM"), "prompt-chunk _hc_mix", values)
    _compile_for_sm121({**entry, "num_warps": triton_mhc.PROMPT_WARPS})


def test_the_prompt_chunk_rotation_compiles_for_sm121():
    """The rotation before a prompt chunk's gate‖up as other GPUs than the H200 launch it — the recorded gathered,
    paired one in the grouped MMA's input order with PROMPT_LAUNCH's rows a program and warps (the record's may be
    of one row) —, which `_entries` may leave out."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from engine.ops import triton_exl3

    entry = _derived(
        triton_exl3._rotate,
        lambda v: v.get("GATHER") and v.get("ORDER") == triton_exl3.INPUT_ORDERS["mma"],
        "gathered _rotate in the grouped MMA's order",
        {"R": triton_exl3.PROMPT_LAUNCH["rotate_rows"]},
    )
    _compile_for_sm121({**entry, "num_warps": triton_exl3.PROMPT_LAUNCH["rotate_warps"]})


@pytest.mark.parametrize("kernel", ["_rotate", "_swiglu_between"])
def test_the_split_operands_compile_for_sm121(kernel):
    """The rotation before a prompt chunk's gate‖up and the SwiGLU before its down as every GPU launches them now:
    writing x as the grouped products' two fp16 operands (SPLIT), derived from a recorded launch in the grouped
    MMA's input order (the record may predate the form). The remainder is the uncontracted `sub.rn.f32`: fused
    with the product before it into an FMA, it would differ in its last bit from the split the products made."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from engine.ops import triton_exl3

    values = {"SPLIT": True} | ({"R": triton_exl3.PROMPT_LAUNCH["rotate_rows"]} if kernel == "_rotate" else {})
    entry = _derived(
        getattr(triton_exl3, kernel),
        lambda v: v.get("ORDER") == triton_exl3.INPUT_ORDERS["mma"] and (kernel != "_rotate" or v.get("GATHER")),
        f"{kernel} in the grouped MMA's order",
        values,
        out_ptr="*fp16",
    )
    ptx = _compile_for_sm121({**entry, "num_warps": triton_exl3.PROMPT_LAUNCH["rotate_warps"]})
    assert "sub.rn.f32" in ptx


@pytest.mark.parametrize("form", ["chunk_bf16", "chunk_fp8", "step_bf16", "step_fp8"])
def test_the_indexer_split_forms_compile_for_sm121(form):
    """DSA's indexer (`_index_scores`) as it reads bf16 and fp8 cache rows — a prompt chunk's keys (one set for
    every query: a bf16 pool's in place, an fp8 pool's as a bf16 copy with their scales) against q's three bf16
    parts, and a decode step's (a query's own, in place; q split in the kernel) — derived from the recorded
    prompt-chunk launch at the served shapes, which may predate these forms. Their products are bf16 MMAs, and every
    form lays their operands out alike (kWidth 2: the same products summed in the same order in each MMA), so a
    query's scores have the same bits in a prompt chunk and a decode step: e4m3 keys loaded as 8-bit values got
    kWidth 4 until `triton_dsa._bf16_boundary` (session 34), a difference the H200/H100 tests saw only as last bits."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from engine.ops import triton_dsa

    chunk = form.startswith("chunk")
    values = dict(SPLIT=True, PARTS=chunk, SCALED=form.endswith("fp8"), GATHER=form != "chunk_fp8", SHARED=chunk)
    values |= {"QB": triton_dsa.INDEX_LAUNCH["queries"] if chunk else 1, "T": None}
    entry = _derived(
        triton_dsa._index_scores,
        lambda v: v.get("SHARED") and v.get("H") == 32 and v.get("D") == 128,
        "prompt-chunk _index_scores at the served shapes",
        values,
        q_ptr="*bf16" if chunk else "*fp32",
        k_ptr="*fp8e4nv" if form == "step_fp8" else "*bf16",
        T="i32",
    )
    asm = _compile_for_sm121({**entry, "num_warps": triton_dsa.INDEX_LAUNCH["num_warps"]}, "all")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in asm["ptx"]
    widths = set(re.findall(r"#ttg\.dot_op<\{opIdx = \d, parent = #mma, kWidth = (\d+)\}>", asm["ttgir"]))
    assert widths == {"2"}, widths


@pytest.mark.parametrize("rows", ["bf16", "fp8"])
def test_the_lane_attention_reading_the_pool_compiles_for_sm121(rows):
    """DSA's lane attention (`_attend_part`) reading a step's latents where a bf16 or fp8 cache pool holds them, by
    slot (GATHER; fp8 with the rows' scales), derived from the recorded launch at the served shapes, which may
    predate the form."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from engine.ops import triton_dsa

    entry = _derived(
        triton_dsa._attend_part,
        lambda v: v.get("R") == 512 and v.get("H") == 32,
        "_attend_part at the served shapes",
        {"GATHER": True, "FP8": rows == "fp8"},
        lat_ptr="*bf16" if rows == "bf16" else "*fp8e4nv",
        slot_ptr="*i64",
    )
    assert "mma.sync" in _compile_for_sm121(entry)


def _compile_for_sm121(entry: dict, asm: str = "ptx") -> Any:
    """The kernel of a recorded (or derived) launch compiled for sm_121: its PTX (or another of its `asm` forms;
    "all": every one, by name)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(entry["module"]), entry["kernel"])
    assert list(entry["signature"]) == fn.arg_names, "the kernel's arguments changed: record again"
    if entry["kernel"] == "_attend_prompt":  # launched by capability: what a GB10 launches, not the H200's record
        entry = _attend_prompt_on_gb10(entry, fn.arg_names)
    if entry["kernel"] == "_index_scores":  # likewise: a GB10 takes INDEX_LAUNCH's pools a program in every form
        entry = _index_scores_on_gb10(entry, fn.arg_names)
    constexprs = {tuple(k): v for k, v in entry["constexprs"]}
    attrs = {tuple(k): [tuple(a) for a in v] for k, v in entry["attrs"]}
    source = ASTSource(fn=fn, signature=entry["signature"], constexprs=constexprs, attrs=attrs)
    options = {"num_warps": entry["num_warps"], "num_stages": entry["num_stages"]}
    options["enable_fp_fusion"] = entry.get("enable_fp_fusion", True)  # recorded where a launch turns it off
    kernel = triton.compile(source, target=GPUTarget("cuda", 121, 32), options=options)
    assert kernel.asm["cubin"] and ".target sm_121" in kernel.asm["ptx"]
    assert kernel.metadata.shared <= GB10_SHARED_PER_BLOCK, (
        f"{entry['kernel']} takes {kernel.metadata.shared} bytes of shared memory a block on sm_121; "
        f"the GB10 allows {GB10_SHARED_PER_BLOCK}: smaller tiles or fewer stages"
    )
    if entry["kernel"] == "_exl3_grouped":  # its tl.dot on the tensor cores there too (wgmma is Hopper's alone)
        assert "mma.sync" in kernel.asm["ptx"] and "wgmma" not in kernel.asm["ptx"]
    return kernel.asm if asm == "all" else kernel.asm[asm]


def _index_scores_on_gb10(entry: dict, names: list[str]) -> dict:
    """A recorded `_index_scores` launch (a prompt chunk's q parts take 128 pools a program on Hopper) with the pools
    a program a GB10 (sm_121) launches it with."""
    from engine.ops import triton_dsa

    values = _constexprs(entry, names)
    values["BP"] = triton_dsa.index_launch((12, 1), bool(values["PARTS"]))["pools"]
    return {**entry, "constexprs": _as_recorded(values, names)}


def _attend_prompt_on_gb10(entry: dict, names: list[str]) -> dict:
    """A recorded `_attend_prompt` launch (the H200's: engine/ops/triton_dsa.py picks its launch by compute
    capability) as a GB10 (sm_121) launches it: its block of tokens, head group, warps and stages."""
    from engine.ops import triton_dsa

    values = _constexprs(entry, names)
    launch = triton_dsa.prompt_launch((12, 1), bool(values["HAS_LO"]))
    values["BT"] = launch["block"]
    values["HG"] = triton_dsa.head_group(launch, values["H"])
    values["HEADS_M"] = launch["heads_m"]
    constexprs = _as_recorded(values, names)
    return {**entry, "constexprs": constexprs, "num_warps": launch["num_warps"], "num_stages": launch["num_stages"]}


def _constexprs(entry: dict, names: list[str]) -> dict:
    """A recorded launch's constexprs by argument name."""
    return {names[k[0]]: v for k, v in entry["constexprs"]}


def _as_recorded(values: dict, names: list[str]) -> list:
    """Constexprs by name in the record's form: [[argument index], value] pairs."""
    return [[[names.index(n)], v] for n, v in values.items()]
