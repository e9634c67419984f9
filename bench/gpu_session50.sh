#!/usr/bin/env bash
# Session 50: a decode step's shared expert on a second stream (moe.SHARED_BESIDE), and where a step's time goes now
# (issue 20's "decode at batch 1"; the last traces of a step are session 19's, before sessions 24-49's kernels):
#  0. tests/gpu/test_exl3_moe_gpu.py's test of the shared expert beside (its bits against one stream's);
#  1. the 4-layer bf16 bench (TP=1, bf16 experts and dense weights), b1-b4 steps, and one step traced;
#  2. the served form's cut (rank 0's TP=2 share, EXL3 experts, q4 dense), b1-b4 steps, the shared expert beside
#     and inline in turn;
#  3. that cut's step traced, every kernel with its GPU time and the gap before it (a verify window of 4 beside).
#     STEPS=0123 BUDGET=300 bash bench/gpu_session50.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s50-out}
T=/tmp/s50-steps
mkdir -p "$OUT" "$T"
rm -f "$T"/*
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
STEPS=${STEPS:-0123}
. bench/run_steps.sh
machine
wheels fla_core einops
want 0 && step "0. shared expert beside: GPU test" 90 "$T/beside_test.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_exl3_moe_gpu.py -k "beside or replays"
if want 1; then
    step "1. 4-layer bf16 decode" 60 "$T/bf16_decode.txt" python bench/gpu_engine.py --dense bf16 --modes graphs \
        --tp2 off --no-prefill --out "$T/bf16_decode.json"
    step "1. 4-layer bf16 step trace" 100 "$T/bf16_trace.txt" python bench/decode_trace.py --dense bf16 --window 1 \
        --out "$T/trace_decode_kkkd_bf16.json"
fi
S="python bench/gpu_engine.py --layers KKKD --exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off --no-prefill"
if want 2; then
    for form in beside inline; do
        flag=; [[ $form == inline ]] && flag=--shared-inline
        step "2. EXL3 q4 cut's decode, shared expert $form" 80 "$T/exl3_$form.txt" $S $flag --out "$T/exl3_$form.json"
    done
fi
if want 3; then
    step "3. EXL3 q4 cut's step trace" 120 "$T/exl3_trace.txt" python bench/decode_trace.py --exl3-experts \
        --shard 2 --dense q4 --out "$T/trace_decode_kkkd_exl3_q4.json"
fi
for f in "$T"/trace_*.json; do [ -f "$f" ] && gzip -c "$f" > "$OUT/$(basename "$f").gz" && rm "$f"; done
collect "$T" "$OUT/benches.json"
