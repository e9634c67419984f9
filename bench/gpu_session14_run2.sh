#!/usr/bin/env bash
# Session 14's second H200 call, ≤ BUDGET s: the served model at its real depth as gpu_session14_run.sh measures it,
# with the dense weights kept 4-bit (DENSE=q4, the reference's default): decode b1-b4, prefill 8k/32k, the GB10
# projection; with the MTP layer: plain step against MTP-drafted verify windows; then decode and prefill with DENSE=fp8.
#     BUDGET=580 bash bench/gpu_session14_run2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s14-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/s14-triton  # shared by the steps: fla-core autotunes its prompt kernels once
BUDGET=${BUDGET:-580}
. bench/run_steps.sh

machine
wheels
released() {  # released DENSE SECONDS
    step "45 layers, EXL3 experts, TP=2 shard, DENSE=$1" "$2" "$OUT/released_$1.txt" \
        python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense "$1" --modes graphs,eager \
        --tp2 off --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$OUT/released_$1.json"
}
released q4 300
step "45 layers + MTP, DENSE=q4, verify windows" 150 "$OUT/verify_q4.txt" \
    python bench/verify_bench.py --layers released --exl3-experts --shard 2 --mtp --dense q4 --out "$OUT/verify_q4.json"
released fp8 150
say "## done after $(( $(date +%s) - START )) s"
