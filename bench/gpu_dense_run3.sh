#!/usr/bin/env bash
# Third DENSE call (session 10), fla-core left out, ≤ BUDGET s: the DENSE GPU tests with the tuned launch and the
# bias-trick q4 product, the products' bench (TP=1 shapes), the 4-layer full-width bench's decode (graphs) and prefill
# with DENSE=q4, fp8 and bf16. (The call also prefilled one prompt three times with grouped GEMMs on, then off, a
# one-off probe: logits 0.012 apart with them, equal without; tests/gpu/test_moe_prompt_gpu.py now checks it.)
#     BUDGET=580 bash bench/gpu_dense_run3.sh    -> dense_tests.txt, dense_bench.json, engine_*.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dense-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-580}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. tests/gpu/test_dense_gpu.py" 100 "$OUT/dense_tests.txt" \
    python -m pytest -q -x -p no:cacheprovider tests/gpu/test_dense_gpu.py
step "2. dense products bench" 60 "$OUT/dense_bench.txt" python bench/dense_bench.py --tp 1,2 --out "$OUT/dense_bench.json"
for mode in q4 fp8 bf16; do
    step "engine --dense $mode" 60 "$OUT/engine_$mode.txt" \
        python bench/gpu_engine.py --dense "$mode" --modes graphs --tp2 off --out "$OUT/engine_$mode.json"
done
say "## done after $(( $(date +%s) - START )) s"
