#!/usr/bin/env bash
# Session 19's third call (issues 18, 20): DSA's lane attention in two kernels (engine/ops/triton_dsa.py), then the
# figures quoted in docs/BENCHMARKS.md, fla-core left out, <= BUDGET s (at most 8 files come back):
#     BUDGET=450 bash bench/gpu_session19_dsa.sh
# 1. bench/record_triton_launches.sh (its GPU tests: drafted == serial, row invariance) -> triton_launches.json;
# 2. tests/gpu/test_mtp_gpu.py, test_graphs.py, test_reuse_gpu.py; 3. bench/row_invariance_cost.py at the released
# depth (a verify window's rows beside other lanes against the serial decode: 0.0); 4. bench/verify_bench.py at the
# released depth with MTP drafts; 5-6. the released depth's decode step, q4 and bf16; 7. the 4-layer bf16 step;
# 8. bench/decode_trace.py, 4 layers, EXL3, q4.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s19d-out}
mkdir -p "$OUT" /tmp/s19d-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-450}
. bench/run_steps.sh
T=/tmp/s19d-steps
E="--modes graphs --tp2 off --no-prefill"
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
step "1. record Triton launches (GPU tests)" 200 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=190 bash bench/record_triton_launches.sh
step "2. tests/gpu: mtp, graphs, reuse" 90 "$T/more_gpu.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_mtp_gpu.py tests/gpu/test_graphs.py tests/gpu/test_reuse_gpu.py
step "3. released depth: row invariance" 80 "$T/rows45.txt" \
    python bench/row_invariance_cost.py $R --out "$T/row_invariance_released45.json"
step "4. released depth + MTP: verify windows" 70 "$T/verify45.txt" \
    python bench/verify_bench.py $R --mtp --out "$T/verify45.json"
for d in q4 bf16; do
    step "5-6. released depth decode, $d" 45 "$T/released_$d.txt" \
        python bench/gpu_engine.py $R --dense $d $E --out "$T/released45_$d.json"
done
step "7. 4 layers decode, bf16" 30 "$T/kkkd_bf16.txt" python bench/gpu_engine.py --dense bf16 $E --out "$T/kkkd_bf16.json"
step "8. decode trace, 4 layers, EXL3, q4" 40 "$T/trace.txt" \
    python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --out "$OUT/trace_kkkd_exl3_q4.json.gz"
collect "$T" "$OUT/benches.json"
