#!/usr/bin/env bash
# Session 26's fifth call, <= BUDGET s: MTP-drafted verify windows on the served model (released depth, rank 0's TP=2
# share, EXL3 experts, q4 dense; session 17 measured them with bf16 dense weights) against its plain step.
#     BUDGET=300 bash bench/gpu_session26_call5.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s26e-out}
mkdir -p "$OUT" /tmp/s26e-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s26e-steps

machine
wheels fla_core einops
step "1. verify windows, released depth + MTP, q4" 270 "$T/verify_released.txt" \
    python bench/verify_bench.py --layers released --exl3-experts --shard 2 --dense q4 --mtp \
    --out "$T/verify_released_q4_mtp.json"
collect "$T" "$OUT/benches.json"
