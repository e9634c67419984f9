"""Session 44's diagnostic copies of `_dense_rows` (bench/gpu_session44_diag.sh): each takes one part of a q4 group's
work out of an engine tree's engine/ops/triton_dense.py, so that a timing through `dense_bench.py --engine` says what
that part costs. Their sums are wrong: timing only, never served or committed under engine/. Written for the tree
at f93da7b (its q4 scales and offsets loaded as two fp16 rows); a source line that is not found stops the script.

    python bench/dense_diag_trees.py TREE OUT_DIR      (makes OUT_DIR/dt-{nosx,nounpack,both,noscales})
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

KERNEL = Path("engine/ops/triton_dense.py")
SX = "        sx = mma_v2(ones, xh, mma_v2(ones, xl, zero))  # Σ x, the same in every output's row\n"
NO_SX = "        sx = zero  # DIAGNOSTIC: no Σ x MMA (wrong sums, timing only)\n"
# the nibbles moved, not unpacked: four register moves for the mask and byte permutes
MOVES = "mov.b32 $0, $4;\nmov.b32 $1, $4;\nmov.b32 $2, $4;\nmov.b32 $3, $4;\n"
S_LOAD = "    s = gl.load(s_ptr + g * stride_s + o_m, mask=o_ok & g_ok, other=0.0).to(gl.float32)\n"
NO_S = "    s = (o_m * 0 + g).to(gl.float32) * 0.001 + 1.0  # DIAGNOSTIC: no scale loads (wrong sums, timing only)\n"
Z_LOAD = "        z = gl.load(z_ptr + g * stride_s + o_m, mask=o_ok & g_ok, other=0.0).to(gl.float32) - 128.0 * s\n"
NO_Z = "        z = 0.5 - 128.0 * s  # DIAGNOSTIC: no offset loads\n"


def _replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise SystemExit(f"not in {KERNEL}: {old.strip()[:80]}")
    return text.replace(old, new)


def _no_unpack(text: str) -> str:
    start = text.index('_Q4_UNPACK = gl.constexpr("""{\n') + len('_Q4_UNPACK = gl.constexpr("""{\n')
    return text[:start] + MOVES + text[text.index('}""")', start) :]


FORMS = {
    "nosx": lambda t: _replace(t, SX, NO_SX),
    "nounpack": _no_unpack,
    "both": lambda t: _no_unpack(_replace(t, SX, NO_SX)),
    "noscales": lambda t: _replace(_replace(t, S_LOAD, NO_S), Z_LOAD, NO_Z),
}


def main() -> None:
    tree, out = Path(sys.argv[1]), Path(sys.argv[2])
    source = (tree / KERNEL).read_text()
    for name, change in FORMS.items():
        copy = out / f"dt-{name}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(tree / "engine", copy / "engine")
        (copy / KERNEL).write_text(change(source))
        print(copy)


if __name__ == "__main__":
    main()
