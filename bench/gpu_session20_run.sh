#!/usr/bin/env bash
# Session 20's first call, <= BUDGET s (at most 8 files come back):
#     BUDGET=560 bash bench/gpu_session20_run.sh
# 1. bench/record_triton_launches.sh (its GPU tests, fla-core left out) -> triton_launches.json; 2. a 4-layer prompt
# chunk traced kernel by kernel (bench/decode_trace.py --prefill, EXL3 experts at TP=2's share, q4, with fla-core;
# fla-core's autotune choices come back as autotune.tgz for later calls); 3. the released depth's decode step, q4.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s20-out}
mkdir -p "$OUT" /tmp/s20-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh
T=/tmp/s20-steps
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
fla_aside
step "1. record Triton launches (GPU tests)" 210 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=200 bash bench/record_triton_launches.sh
step "2. prefill trace, 4 layers, EXL3, q4, 8k" 260 "$T/prefill_trace.txt" \
    $FLA python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 \
    --dense q4 --prefill 8192 --out "$OUT/trace_prefill_kkkd_exl3_q4.json.gz"
autotune_back
step "3. released depth decode, q4" 40 "$T/released_q4.txt" \
    python bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill --out "$T/released45_q4.json"
collect "$T" "$OUT/benches.json"
