#!/usr/bin/env bash
# Fourth DENSE call (session 10), fla-core left out, ≤ BUDGET s: the per-weight dequantisation back (the sweep's
# fastest form) and the prompt MoE's pairs summed in a fixed order: the prompt MoE tests (repeatable bits) and the
# full-width row invariance, the kernel tests, the products' bench (TP=1), decode with DENSE=q4 and fp8
#     BUDGET=260 bash bench/gpu_dense_run4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dense-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-260}
. bench/run_steps.sh

machine
wheels fla_core einops
step "2. prompt MoE + full-width invariance" 60 "$OUT/moe_tests.txt" python -m pytest -q -x -p no:cacheprovider \
    tests/gpu/test_moe_prompt_gpu.py "tests/gpu/test_drafts_gpu.py::test_rows_are_invariant_at_full_width"
step "3. dense kernel tests" 40 "$OUT/dense_tests.txt" python -m pytest -q -x -p no:cacheprovider \
    tests/gpu/test_dense_gpu.py -k "kernel or bits or graph or reference"
step "4. dense products bench" 40 "$OUT/dense_bench.txt" python bench/dense_bench.py --tp 1 --out "$OUT/dense_bench.json"
for mode in q4 fp8; do
    step "engine --dense $mode" 35 "$OUT/engine_$mode.txt" python bench/gpu_engine.py --dense "$mode" --modes graphs \
        --tp2 off --no-prefill --out "$OUT/engine_$mode.json"
done
say "## done after $(( $(date +%s) - START )) s"
