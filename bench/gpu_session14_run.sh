#!/usr/bin/env bash
# Session 14's H200 call, ≤ BUDGET s: the served model measured at its real depth (issue 20, Deliver 4) — all 45
# layers at the widths of one Spark of a TP=2 pair (rank 0's share on this one GPU, bench/gpu_engine.py
# ShardStandIn), routed experts as random 4-bit EXL3 banks, dense weights bf16 (the DENSE default), fla-core for KDA
# prompts as the image has it. Decode b1-b4 (graphs; eager too, to count the collectives), prefill 8k/32k, the GB10
# projection; then the same depth with the MTP layer: plain step against MTP-drafted verify windows.
#     BUDGET=580 bash bench/gpu_session14_run.sh
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
step "1. 4 layers, EXL3 experts, TP=2 shard (path check, fla-core autotune)" 240 "$OUT/kkkd.txt" \
    python bench/gpu_engine.py --layers KKKD --exl3-experts --shard 2 --modes graphs --tp2 off \
    --prefill-lengths 2048 --prefill-repeats 1 --out "$OUT/kkkd.json"
step "2. 45 layers, EXL3 experts, TP=2 shard" 200 "$OUT/released.txt" \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --modes graphs,eager --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 2 --out "$OUT/released.json"
step "3. 45 layers + MTP, verify windows" 150 "$OUT/verify.txt" \
    python bench/verify_bench.py --layers released --exl3-experts --shard 2 --mtp --out "$OUT/verify.json"
nvidia-smi --query-gpu=memory.used --format=csv >> "$LOG" 2>&1
say "## done after $(( $(date +%s) - START )) s"
