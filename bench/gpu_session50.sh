#!/usr/bin/env bash
# Session 50: where a decode step's time goes now (issue 20's "decode at batch 1"; the last traces of a step are
# session 19's, before sessions 24-49's kernels), each kernel of one graphed step beside its GPU time and the gap
# before it, on the 4-layer cut:
#  1. the bf16 bench (TP=1, bf16 experts and dense weights), drafts off, and its b1-b4 steps timed;
#  2. the served form's cut (rank 0's TP=2 share, EXL3 experts, q4 dense), a verify window of 4 beside it.
#     STEPS=12 BUDGET=300 bash bench/gpu_session50.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s50-out}
T=/tmp/s50-steps
mkdir -p "$OUT" "$T"
rm -f "$T"/*
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
STEPS=${STEPS:-12}
. bench/run_steps.sh
machine
wheels fla_core einops
if want 1; then
    step "1. 4-layer bf16 decode" 60 "$T/bf16_decode.txt" python bench/gpu_engine.py --dense bf16 --modes graphs \
        --tp2 off --no-prefill --out "$T/bf16_decode.json"
    step "1. 4-layer bf16 step trace" 100 "$T/bf16_trace.txt" python bench/decode_trace.py --dense bf16 --window 1 \
        --out "$T/trace_decode_kkkd_bf16.json"
fi
if want 2; then
    step "2. 4-layer EXL3 q4 step trace" 120 "$T/exl3_trace.txt" python bench/decode_trace.py --exl3-experts \
        --shard 2 --dense q4 --out "$T/trace_decode_kkkd_exl3_q4.json"
fi
for f in "$T"/trace_*.json; do [ -f "$f" ] && gzip -c "$f" > "$OUT/$(basename "$f").gz" && rm "$f"; done
collect "$T" "$OUT/benches.json"
