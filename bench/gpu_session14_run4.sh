#!/usr/bin/env bash
# Session 14's fourth H200 call, ≤ BUDGET s: the 4-layer full-width bf16 bench at TP=1 with fla-core (as the image
# has it) and transformers' glm5_next at the same config measured warm in the same process (issue 20's must-show):
# decode b1-b4 (graphs) and b1 with each token read back, prefill 2k/8k/32k, per-layer times, ours / transformers.
#     BUDGET=560 bash bench/gpu_session14_run4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s14-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh

machine
wheels
step "4 layers (KKKD), bf16, TP=1, fla-core; transformers warm" 540 "$OUT/kkkd_bf16.txt" \
    python bench/gpu_engine.py --layers KKKD --modes graphs --tp2 off --transformers --out "$OUT/kkkd_bf16.json"
say "## done after $(( $(date +%s) - START )) s"
