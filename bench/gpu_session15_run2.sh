#!/usr/bin/env bash
# Session 15's second prepared H200 call (after gpu_session15_run.sh), <= BUDGET s: the prompt-path candidates at the
# served model's depth and format - 45 layers, random 4-bit EXL3 routed experts, rank 0's TP=2 share on this GPU
# (ShardStandIn) - prefill at 8k and 32k once each per candidate, last logits of an 8k prompt against today's form.
#     BUDGET=590 bash bench/gpu_session15_run2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s15-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh

machine
wheels
step "45 layers, EXL3 experts, TP=2 shard, fla-core: prompt candidates" 580 "$OUT/released45_candidates.txt" \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --modes none --tp2 off --no-prefill \
    --prompt-candidates --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$OUT/released45_candidates.json"
say "## done after $(( $(date +%s) - START )) s"
