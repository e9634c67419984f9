#!/usr/bin/env bash
# Session 34's first device call (needs an H200: the released depth's EXL3 experts at rank 0's TP=2 share are ~76 GB),
# <= BUDGET s: the released depth's graphed q4 decode step at b1/b4 (session 25: 8.36 ms at b1) and its prompts of
# 8k (warm-up) / 32k / 128k / 256k with fla-core and the batch-1 step after each (session 30: 5,045 / 4,227 / 3,716
# tok/s, 8.63 / 8.75 / 8.76 ms), with every DSA pool choice in session 33's segmented kernels.
#     BUDGET=590 bash bench/gpu_session34_call1.sh
# (CONTEXTS=8192,32768 for a shorter call: the prompts' lengths)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s34a-out}
mkdir -p "$OUT" /tmp/s34a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh
T=/tmp/s34a-steps
R="--layers released --exl3-experts --shard 2"
CONTEXTS=${CONTEXTS:-8192,32768,131072,262144}

machine
wheels fla_core einops
fla_aside
step "1. released q4, graphed decode step" 80 "$T/decode.txt" python bench/gpu_engine.py $R --dense q4 --modes graphs \
    --tp2 off --no-prefill --out "$T/decode45_q4.json"
step "2. released q4 with fla-core: prompts of 8k..256k and the batch-1 step after each" 400 "$T/long.txt" $FLA \
    python bench/gpu_engine.py $R --dense q4 --modes none --tp2 off --no-prefill \
    --long-contexts "$CONTEXTS" --out "$T/long_context_released_q4.json"
collect "$T" "$OUT/benches.json"
