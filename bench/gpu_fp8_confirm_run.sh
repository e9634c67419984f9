#!/usr/bin/env bash
# The launch table's fp8 rule (loads ahead at every size, session 18) confirmed on the lent H200, <= BUDGET s:
#     BUDGET=200 bash bench/gpu_fp8_confirm_run.sh
# 1. tests/gpu/test_dense_gpu.py; 2. the 4-layer decode step, fp8 and bf16; 3. the released depth's, fp8;
# 4. bench/dense_bench.py at TP=1, 20 calls a graph from HBM.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fp8-out}
mkdir -p "$OUT" /tmp/fp8-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-200}
. bench/run_steps.sh
T=/tmp/fp8-steps
E="--modes graphs --tp2 off --no-prefill"

machine
wheels fla_core einops
step "1. tests/gpu/test_dense_gpu.py" 80 "$OUT/dense_gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_dense_gpu.py
for d in fp8 bf16; do
    step "2. 4 layers decode, $d" 30 "$T/kkkd_$d.txt" python bench/gpu_engine.py --dense $d $E --out "$OUT/kkkd_$d.json"
done
step "3. released depth decode, fp8" 40 "$T/released_fp8.txt" \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense fp8 $E --out "$OUT/released45_fp8.json"
step "4. dense products, 20 calls a graph" 60 "$T/dense20.txt" \
    python bench/dense_bench.py --tp 1 --calls 20 --out "$OUT/dense_products_calls20.json"
say "## done after $(( $(date +%s) - START )) s"
