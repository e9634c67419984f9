#!/usr/bin/env bash
# First DENSE call (session 10), fla-core left out, ≤ BUDGET s: the DENSE GPU tests, the products' bench on the
# real dense shapes, and the Triton launch record (the GPU tests that launch every engine kernel)
#     BUDGET=580 bash bench/gpu_dense_run.sh          -> dense_tests.txt, dense_bench.json, triton_launches.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dense-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-580}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. tests/gpu/test_dense_gpu.py" 200 "$OUT/dense_tests.txt" \
    python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_dense_gpu.py
step "2. dense products bench" 120 "$OUT/dense_bench.txt" python bench/dense_bench.py --out "$OUT/dense_bench.json"
step "3. triton launch record" 300 "$OUT/record.txt" env OUT="$OUT" LIMIT=280 bash bench/record_triton_launches.sh
say "## done after $(( $(date +%s) - START )) s"
