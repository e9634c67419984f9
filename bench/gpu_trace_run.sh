#!/usr/bin/env bash
# Where a batch-1 decode step's time goes, kernel by kernel (session 19, issue 20), fla-core left out, <= BUDGET s:
#     BUDGET=300 bash bench/gpu_trace_run.sh
# 1. bench/decode_trace.py, 4 layers (KKKD), rank 0's TP=2 share, EXL3 experts, DENSE=q4 (the GB10 candidate);
# 2. the same with bf16 dense weights and bf16 experts at TP=1 (the 4-layer bench of issue 20).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/trace-out}
mkdir -p "$OUT" /tmp/trace-steps
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/trace-steps

machine
wheels fla_core einops
step "1. trace KKKD exl3 shard 2 q4" 120 "$T/q4.txt" \
    python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --out "$OUT/trace_kkkd_exl3_q4.json.gz"
step "2. trace KKKD bf16 TP=1" 90 "$T/bf16.txt" \
    python bench/decode_trace.py --layers KKKD --dense bf16 --out "$OUT/trace_kkkd_bf16.json.gz"
tail -c 3000 "$T/q4.txt" >> "$LOG"
say "## done after $(( $(date +%s) - START )) s"
