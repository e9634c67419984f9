#!/usr/bin/env bash
# The reduced-precision decode kernel in registers (session 18, issue 19) on the lent H200, fla-core left out,
# <= BUDGET s; every file it keeps is under $OUT (at most 8 come back from a device call: step outputs go to /tmp):
#     BUDGET=450 bash bench/gpu_q4_run.sh
# 1. tests/gpu/test_dense_gpu.py (the kernel against the exact products, row invariance, graphs, the model with q4);
# 2. bench/dense_bench.py, 20 calls a graph over copies that miss L2, TP=1 and TP=2 shapes; 3-5. the 4-layer decode
# step, q4, fp8, bf16; 6-7. the released depth's decode step, q4 and fp8 (EXL3 experts, rank 0's TP=2 share); 8. the
# products one call a graph (the earlier tables' method), TP=1; 9. the launch sweep with what time is left.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/q4-out}
mkdir -p "$OUT" /tmp/q4-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-450}
. bench/run_steps.sh
T=/tmp/q4-steps
E="--modes graphs --tp2 off --no-prefill"
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
step "1. tests/gpu/test_dense_gpu.py" 100 "$OUT/dense_gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_dense_gpu.py
step "2. dense products, 20 calls a graph" 90 "$T/dense20.txt" \
    python bench/dense_bench.py --tp 1,2 --calls 20 --out "$OUT/dense_products_calls20.json"
for d in q4 fp8 bf16; do
    step "3-5. 4 layers decode, $d" 40 "$T/kkkd_$d.txt" python bench/gpu_engine.py --dense $d $E --out "$T/kkkd_$d.json"
done
for d in q4 fp8; do
    step "6-7. released depth decode, $d" 60 "$T/released_$d.txt" \
        python bench/gpu_engine.py $R --dense $d $E --out "$T/released45_$d.json"
done
step "8. dense products, one call a graph" 35 "$T/dense1.txt" \
    python bench/dense_bench.py --tp 1 --out "$T/dense_products_calls1.json"
step "9. launch sweep" 200 "$T/sweep.txt" python bench/dense_bench.py --sweep --out "$T/dense_sweep.json"
collect "$T" "$OUT/engine_and_sweep.json"
