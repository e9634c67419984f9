#!/usr/bin/env bash
# Session 19's second call (issue 20): the hyper-connection mix on one warp and the RMS norm a row a program, then
# the figures quoted in docs/BENCHMARKS.md, fla-core left out, <= BUDGET s (at most 8 files come back):
#     BUDGET=560 bash bench/gpu_session19_final.sh
# 1. bench/record_triton_launches.sh (its GPU tests) -> triton_launches.json; 2. tests/gpu/test_mtp_gpu.py;
# 3-4. the released depth's decode step, q4 and bf16 (EXL3 experts, rank 0's TP=2 share); 5. the 4-layer bf16 step;
# 6. bench/verify_bench.py at the released depth with MTP drafts; 7. bench/decode_trace.py, 4 layers, EXL3, q4.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s19f-out}
mkdir -p "$OUT" /tmp/s19f-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh
T=/tmp/s19f-steps
E="--modes graphs --tp2 off --no-prefill"
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
step "1. record Triton launches (GPU tests)" 250 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=235 bash bench/record_triton_launches.sh
step "2. tests/gpu/test_mtp_gpu.py" 100 "$T/mtp_gpu.txt" python -m pytest -q -p no:cacheprovider tests/gpu/test_mtp_gpu.py
for d in q4 bf16; do
    step "3-4. released depth decode, $d" 60 "$T/released_$d.txt" \
        python bench/gpu_engine.py $R --dense $d $E --out "$T/released45_$d.json"
done
step "5. 4 layers decode, bf16" 40 "$T/kkkd_bf16.txt" python bench/gpu_engine.py --dense bf16 $E --out "$T/kkkd_bf16.json"
step "6. released depth + MTP: verify windows" 100 "$T/verify45.txt" \
    python bench/verify_bench.py $R --mtp --out "$T/verify45.json"
step "7. decode trace, 4 layers, EXL3, q4" 60 "$T/trace.txt" \
    python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --out "$OUT/trace_kkkd_exl3_q4.json.gz"
collect "$T" "$OUT/benches.json"
