#!/usr/bin/env bash
# Session 27's third call, <= BUDGET s (issue 19): tests/gpu/test_dense_gpu.py, then the dense decode kernel's launch forms on the served weights
# (DENSE=q4's: the LM head fp8, the rest q4; TP=1 and TP=2's LM head and KDA input projection), outputs a program
# 64 or 128, 2 or 4 warps, the input split around the table's, unrolled or not; then the table's own form and the
# grid's best three timed again in turn, three times; one row also with the kernel compiled for any row count
# (bench/dense_bench.py --sweep).
#     BUDGET=420 bash bench/gpu_session27_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s27c-out}
mkdir -p "$OUT" /tmp/s27c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-440}
. bench/run_steps.sh
T=/tmp/s27c-steps

machine
wheels fla_core einops
step "1. tests/gpu/test_dense_gpu.py" 110 "$OUT/dense_gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_dense_gpu.py
step "2. launch sweep, served weights" 320 "$T/sweep.txt" python bench/dense_bench.py --sweep --out "$T/dense_sweep.json"
collect "$T" "$OUT/benches.json"
