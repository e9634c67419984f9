#!/usr/bin/env bash
# Session 14's fifth H200 call, ≤ BUDGET s: where a prompt chunk's time goes — the 4-layer full-width bf16 bench at
# TP=1 with fla-core, the 2,048-token chunk ending at 2k / 8k / 32k under torch.profiler (GPU time per kernel).
#     BUDGET=300 bash bench/gpu_session14_run5.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s14-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh

machine
wheels
step "4 layers (KKKD), bf16, TP=1, fla-core: prompt chunk profiles" 290 "$OUT/prefill_profile.txt" \
    python bench/gpu_engine.py --layers KKKD --modes none --no-prefill --tp2 off --profile-prefill 2048,8192,32768 \
    --out "$OUT/prefill_profile.json"
say "## done after $(( $(date +%s) - START )) s"
