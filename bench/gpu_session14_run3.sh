#!/usr/bin/env bash
# Session 14's third H200 call, ≤ BUDGET s: the decode figures of gpu_session14_run.sh / run2.sh again after the
# bench's RandomReader stopped keeping whole tensors behind row shards (the embedding, the LM head and DSA's q_b
# were counted whole in the bytes a step reads, ~1.5 GB a step too many at DENSE=bf16): 45 layers, EXL3 experts,
# TP=2 shard, DENSE bf16 / q4 / fp8, decode b1-b4 (graphs and eager), no prefill (fla-core left out: prompts are not
# timed here).
#     BUDGET=400 bash bench/gpu_session14_run3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s14-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-400}
. bench/run_steps.sh

machine
wheels fla_core einops
for dense in bf16 q4 fp8; do
    step "45 layers, EXL3 experts, TP=2 shard, DENSE=$dense, decode" 130 "$OUT/decode_$dense.txt" \
        python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense "$dense" --modes graphs,eager \
        --tp2 off --no-prefill --out "$OUT/decode_$dense.json"
done
say "## done after $(( $(date +%s) - START )) s"
