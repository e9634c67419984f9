#!/usr/bin/env bash
# Session 19's fourth call: DSA's lane attention with pipelined slices and a one-pass combine, fla-core left out,
# <= BUDGET s (at most 8 files come back):
#     BUDGET=330 bash bench/gpu_session19_dsa2.sh
# 1. bench/record_triton_launches.sh (its GPU tests) -> triton_launches.json; 2. bench/decode_trace.py, 4 layers,
# EXL3, q4; 3. bench/row_invariance_cost.py at the released depth; 4. bench/verify_bench.py at the released depth
# with MTP drafts; 5. the released depth's decode step, q4.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s19e-out}
mkdir -p "$OUT" /tmp/s19e-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-330}
. bench/run_steps.sh
T=/tmp/s19e-steps
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
step "1. record Triton launches (GPU tests)" 200 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=190 bash bench/record_triton_launches.sh
step "2. decode trace, 4 layers, EXL3, q4" 30 "$T/trace.txt" \
    python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --out "$OUT/trace_kkkd_exl3_q4.json.gz"
step "3. released depth: row invariance" 40 "$T/rows45.txt" \
    python bench/row_invariance_cost.py $R --out "$T/row_invariance_released45.json"
step "4. released depth + MTP: verify windows" 30 "$T/verify45.txt" \
    python bench/verify_bench.py $R --mtp --out "$T/verify45.json"
step "5. released depth decode, q4" 30 "$T/released_q4.txt" \
    python bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill --out "$T/released45_q4.json"
collect "$T" "$OUT/benches.json"
