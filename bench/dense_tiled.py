"""Does the stored layout of a reduced dense weight bind the decode products (issue 19)? Kept in rows, each program of
`_dense_rows` reads its block of 128 outputs a group at a time, 32 bytes of each output's row (q4; fp8 64), the rows
a whole input width apart; tiled (engine/quant/dense.py `tile`: [output blocks, groups, 128 outputs, a group's
bytes]) a program's slice is one run of memory. This bench times the engine's kernel on each served shape quantised
both ways (`dense.tiled_shape` replaced: none tiled, then every shape, whatever the engine's rule) — the tiled one
as the engine launches it (`tiled`), in the kernel's form for whole tiles (`tiled_whole`, one base a block) and in
its form for a slice from inside a tile (`tiled_any`, each row's tile reckoned) — and a plain read of the same bytes
(the ceiling for that many bytes in one launch: an XOR of each program's words). Every form must give the rows' bits
(checked before timing). 20 calls a graph over copies that miss L2, the forms in turn, three rounds, medians.
(Session 48's first call timed a copy of the kernel patched to read tiles, before the engine kept them.)

    python bench/dense_tiled.py [--out FILE] [--tp 1] [--names kda_in_proj,...] [--modes q4,fp8] [--rows 1,8]
    ncu -k regex:_dense_rows -c 2 python bench/dense_tiled.py --ncu kda_in_proj   # one call in each layout
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from dense_bench import copies, hbm_bytes_s, shapes, timed  # noqa: E402

from engine.ops import triton_dense  # noqa: E402
from engine.quant import dense  # noqa: E402

# a tiled weight's forms beside the engine's own (`tiled`, `launch_shape`'s whole_from): its blocks read from one
# base each, and the form for a slice from inside a tile (each row's tile reckoned)
OTHER_FORMS = {"tiled_whole": dict(whole_from=1), "tiled_any": dict(whole_from=0)}


@triton.jit
def _read(p, out, n, PER: tl.constexpr, BLOCK: tl.constexpr):
    """XOR of a program's PER int32 words, BLOCK at a time: every byte read once."""
    base = tl.program_id(0).to(tl.int64) * PER
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(0, PER, BLOCK):
        at = base + i + tl.arange(0, BLOCK)
        acc ^= tl.load(p + at, mask=at < n, other=0)
    tl.store(out + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), acc)


def read_call(words: torch.Tensor, programs: int = 1056, block: int = 1024):
    n = words.numel()
    per = triton.cdiv(triton.cdiv(n, programs), block) * block
    grid = triton.cdiv(n, per)
    out = torch.empty(grid * block, dtype=torch.int32, device=words.device)
    return lambda: _read[(grid,)](words, out, n, PER=per, BLOCK=block, num_warps=4)


def flat_words(weight) -> torch.Tensor:
    """The weight's bytes (codes and scales) as one int32 tensor."""
    parts = [weight.data.view(torch.uint8).reshape(-1), (weight.pairs if weight.pairs is not None else weight.scale)]
    return torch.cat([parts[0], parts[1].contiguous().view(torch.uint8).reshape(-1)]).view(torch.int32)


def both(out: int, width: int, mode: str, gen: torch.Generator) -> dict:
    """One random weight quantised in rows and tiled (`dense.tiled_shape` replaced for each, then put back)."""
    weight = (torch.randn(out, width, generator=gen, device="cuda") * 0.02).bfloat16()
    kept, found = dense.tiled_shape, {}

    def whole_groups(out: int, width: int, group: int = dense.GROUP) -> bool:  # tiled whatever the padding
        return width % group == 0

    try:
        for layout, rule in (("rows", lambda *_: False), ("tiled", whole_groups)):
            dense.tiled_shape = rule
            found[layout] = dense.quantize(weight, mode)
    finally:
        dense.tiled_shape = kept
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tp", default="1")
    ap.add_argument(
        "--names", default="kda_in_proj,dense_gate_up,dsa_q_b,kda_o_proj,dsa_o_proj,dense_down,shared_gate_up"
    )
    ap.add_argument("--modes", default="q4,fp8")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--ncu", default="", help="one call of each layout on this q4 weight (TP=1), nothing timed")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.ncu:
        out, width = shapes(1)[args.ncu]
        x = torch.randn(1, width, generator=gen, device="cuda")
        for stored in both(out, width, "q4", gen).values():
            triton_dense.dense_rows(x, stored)
        torch.cuda.synchronize()
        return
    hbm = hbm_bytes_s()
    found: dict = {"gpu": torch.cuda.get_device_name(), "hbm_bytes_s": hbm, "shapes": {}}
    rows_timed = [int(r) for r in args.rows.split(",")]
    for tp in (int(t) for t in args.tp.split(",")):
        for name in args.names.split(","):
            out, width = shapes(tp)[name]
            for mode in args.modes.split(","):
                if mode == "q4" and width % 64:
                    continue
                stored = both(out, width, mode, gen)
                held = stored["rows"].nbytes()
                weights = {layout: copies(w, held) for layout, w in stored.items()}
                words = [flat_words(w) for w in weights["rows"]]
                entry: dict = {"shape": [out, width], "bytes": held}
                for rows in rows_timed:
                    x = torch.randn(rows, width, generator=gen, device="cuda")
                    expected = triton_dense.dense_rows(x, stored["rows"])
                    same = all(
                        torch.equal(triton_dense.dense_rows(x, stored["tiled"], form), expected)
                        for form in (None, *OTHER_FORMS.values())
                    )
                    calls = max(20, len(words))
                    forms = {
                        layout: [lambda w=ws[i % len(ws)], x=x: triton_dense.dense_rows(x, w) for i in range(calls)]
                        for layout, ws in weights.items()
                    }
                    # the tiled weight through the kernel's other forms
                    tiles = weights["tiled"]
                    for key, other in OTHER_FORMS.items():
                        forms[key] = [
                            lambda w=tiles[i % len(tiles)], x=x, other=other: triton_dense.dense_rows(x, w, other)
                            for i in range(calls)
                        ]
                    forms["read"] = [read_call(words[i % len(words)]) for i in range(calls)]
                    times: dict[str, list[float]] = {k: [] for k in forms}
                    for _ in range(3):
                        for key, chain in forms.items():
                            times[key].append(timed(chain, repeat=20))
                    moved = held + rows * width * 4 + rows * out * 4
                    result: dict = {"tiled_bits_equal": same}
                    for key, runs in times.items():
                        sec = statistics.median(runs)
                        result[key] = {"us": round(sec * 1e6, 2), "hbm": round(moved / sec / hbm, 3)}
                    entry[str(rows)] = result
                    print(f"tp{tp}/{name} {mode} rows {rows}: {result}", flush=True)
                found["shapes"][f"tp{tp}/{name}/{mode}"] = entry
                del stored, weights, words
                torch.cuda.empty_cache()
                if args.out:
                    args.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
