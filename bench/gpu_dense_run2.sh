#!/usr/bin/env bash
# Second DENSE call (session 10), fla-core left out, ≤ BUDGET s: the DENSE GPU tests after the input-major layout,
# the products' bench (TP=1 shapes) and a sweep of launch shapes. (The call also ran the full-width row-invariance
# test with the prompt MoE's grouped GEMMs off, a one-off probe: it passed, which found the grouped path's defect.)
#     BUDGET=580 bash bench/gpu_dense_run2.sh        -> dense_tests.txt, dense_bench.json, sweep.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dense-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-580}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. tests/gpu/test_dense_gpu.py" 120 "$OUT/dense_tests.txt" \
    python -m pytest -q -x -p no:cacheprovider tests/gpu/test_dense_gpu.py
step "2. dense products bench" 60 "$OUT/dense_bench.txt" python bench/dense_bench.py --tp 1 --out "$OUT/dense_bench.json"
step "4. launch sweep" 300 "$OUT/sweep.txt" python bench/dense_bench.py --sweep --out "$OUT/sweep.json"
say "## done after $(( $(date +%s) - START )) s"
