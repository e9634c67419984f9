#!/usr/bin/env bash
# Session 49, one H100 or H200 (issue 19): a tiled weight whose blocks are whole tiles read from one base a block
# (triton_dense `_dense_rows` WHOLE_TILES, its loads untested by row), against the per-row form (each row's tile
# reckoned, what session 48 kept and what a slice from inside a tile still takes).
#  1. bench/dense_tiled.py at TP=1 and 2: every served shape in rows, tiled in the engine's form and the two others,
#     and a plain read;
#  2. the 4-layer cut's decode step with q4 dense weights (graphs, b1-b4): the tree before (PREV, the per-row form
#     on every tiled weight) and this one;
#  3. tests/gpu/test_dense_gpu.py;
#  4. the same decode step with fp8, then q4, dense weights.
#     STEPS=123 BUDGET=430 bash bench/gpu_session49.sh   (call 2 ran 6ffc392's form: each whole tile's slice asked
#     of L2 first by a bulk prefetch, `tiled` there; `tiled_plain` the form for whole tiles without it; call 3:
#     STEPS=134 BUDGET=330 TPS=1,2 NAMES=kda_in_proj,dense_gate_up,dsa_q_b,lm_head MODES=fp8)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s49-out}
T=/tmp/s49-steps
PREV=${PREV:-ed59b0a}  # the tree timed against (.wheels/prev/tree-$PREV.tgz)
mkdir -p "$OUT" "$T"
rm -rf "${T:?}"/*
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-420} STEPS=${STEPS:-123}
. bench/run_steps.sh
machine
wheels fla_core einops
prev_tree
if want 1; then
    N=kda_in_proj,dense_gate_up,dsa_q_b,kda_o_proj,dsa_o_proj,dense_down,shared_gate_up,shared_down,lm_head
    step "1. rows / the tiled forms / read" 200 "$T/tiled.txt" python bench/dense_tiled.py --tp "${TPS:-1,2}" \
        --names "${NAMES:-$N}" --modes "${MODES:-q4,fp8}" --out "$T/tiled.json"
fi
if want 2; then
    dense_steps "$T" "$PREV" "$OLD" whole
fi
if want 3; then
    step "3. dense GPU tests" 150 "$T/tests.txt" python -m pytest -q -rfE --tb=short -p no:cacheprovider -n 4 \
        tests/gpu/test_dense_gpu.py
fi
if want 4; then  # the 4-layer step with fp8 then q4 dense weights, PREV's tree then this one each
    dense_steps "$T" "$PREV" "$OLD" whole fp8
    dense_steps "$T" "$PREV" "$OLD" whole q4
fi
collect "$T" "$OUT/benches.json"
rm -f "$OUT/pip.log"
