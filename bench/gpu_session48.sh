#!/usr/bin/env bash
# Session 48, one H100 or H200 (issue 19): the dense weights' codes kept tiled (engine/quant/dense.py `tile`).
#  1. tests/gpu/test_dense_gpu.py with the launches recorded (bench/record_triton_launches.sh: `_dequantize` took the
#     tiled weights' TILE and first) -> $OUT/triton_launches.json for tests/fixtures;
#  2. bench/dense_tiled.py at TP=1 and 2: the engine's kernel on each served shape kept in rows and tiled, and a plain
#     read of the same bytes;
#  3. the 4-layer cut's decode step with q4 dense weights (graphs, b1-b4), the tree before (PREV, kept in rows) and
#     this one;
#  4. the launch forms swept on the tiled tall weights.
#     STEPS=1234 BUDGET=540 bash bench/gpu_session48.sh   (call 2: STEPS=123 BUDGET=380; a call 3 for main's rule,
#     every weight of whole groups tiled — STEPS=123 BUDGET=230 TPS=1 NAMES=kda_o_proj,dsa_o_proj,dense_down MODES=q4
#     — was refused: no device time left)
# (Session 48's first call ran bench/dense_tiled.py's first form — a copy of the kernel patched to read tiles, the
# engine's own then read rows — with Nsight Compute on kda_in_proj.)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s48-out}
T=/tmp/s48-steps
PREV=${PREV:-6c6c8f3}  # the tree timed against (.wheels/prev/tree-$PREV.tgz)
mkdir -p "$OUT" "$T"
rm -rf "${T:?}"/*
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540} STEPS=${STEPS:-1234}
. bench/run_steps.sh
machine
wheels fla_core einops
prev_tree
if want 1; then
    step "1. dense GPU tests, recorded" 200 "$T/record.txt" env OUT="$T/rec" LIMIT=190 PYTHONPATH=/tmp/pylib \
        TESTS="tests/gpu/test_dense_gpu.py" KERNELS="_dequantize" bash bench/record_triton_launches.sh
    cp "$T/rec/record_tests.txt" "$T/tests.txt" 2>/dev/null
    cp "$T/rec/triton_launches.json" "$OUT/" 2>/dev/null
fi
if want 2; then
    N=kda_in_proj,dense_gate_up,dsa_q_b,kda_o_proj,dsa_o_proj,dense_down,shared_gate_up,shared_down,lm_head
    step "2. rows / tiled / read" 200 "$T/tiled.txt" python bench/dense_tiled.py --tp "${TPS:-1,2}" \
        --names "${NAMES:-$N}" --modes "${MODES:-q4,fp8}" --out "$T/tiled.json"
fi
if want 3; then
    dense_steps "$T" "$PREV" "$OLD" tiled
fi
if want 4; then
    step "4. sweep the tiled tall weights" 200 "$T/sweep.txt" python bench/dense_bench.py --sweep \
        --swept kda_in_proj:q4,dense_gate_up:q4,tp2/kda_in_proj:q4,lm_head:fp8 --repeat 10 --out "$T/sweep.json"
fi
collect "$T" "$OUT/benches.json"
