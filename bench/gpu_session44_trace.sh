#!/usr/bin/env bash
# Session 44, an H200 (the released depth's weights at rank 0's TP=2 share are 74.6 GiB): where the released depth's
# time goes now — session 23's trace predates sessions 24-44.
#  1. the 2,048-token prompt chunk ending at 8,192 (fla-core): wall time, GPU idle, time by scope;
#  2. the decode steps b1-b4 timed (graphs), with the q4 scales as one word (session 44);
#  3. the decode step at b1 (the decoder a server with drafts uses), every kernel.
#     BUDGET=540 bash bench/gpu_session44_trace.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s44t-out}
mkdir -p "$OUT" /tmp/s44t-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}
. bench/run_steps.sh
T=/tmp/s44t-steps
rm -f "$T"/*
machine
wheels fla_core einops
fla_aside
R="--layers released --exl3-experts --shard 2 --dense q4"
step "1. released prompt chunk trace" 240 "$T/a_prefill.txt" $FLA python bench/decode_trace.py $R --prefill 8192 \
    --out "$T/trace_prefill_released_q4.json"
step "2. released decode, this tree" 90 "$T/c_decode.txt" python bench/gpu_engine.py $R --modes graphs --tp2 off \
    --no-prefill --out "$T/released_decode.json"
step "3. released decode step trace" 150 "$T/b_decode.txt" python bench/decode_trace.py $R \
    --out "$T/trace_decode_released_q4.json"
for f in "$T"/trace_*.json; do [ -f "$f" ] && gzip -c "$f" > "$OUT/$(basename "$f").gz" && rm "$f"; done
collect "$T" "$OUT/benches.json"
