#!/usr/bin/env bash
# Session 30's device call, <= BUDGET s: the Triton launches recorded again (session 28's call ran the record
# without the wheels on its path and recorded nothing; copy $OUT/triton_launches.json over
# tests/fixtures/triton_launches.json), then the released depth's prompts of 8k / 32k / 128k / 256k tokens with
# fla-core's KDA (session 29's second call left fla-core out, so its KDA ran the torch reference form) and the
# batch-1 step after each (the reference's page: 1,952 / 1,979 / 1,838 / 1,642 tok/s on two Sparks).
#     BUDGET=500 bash bench/gpu_session30_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s30a-out}
mkdir -p "$OUT" /tmp/s30a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-500}
. bench/run_steps.sh
T=/tmp/s30a-steps

machine
wheels fla_core einops
step "1. record Triton launches (GPU tests, 6 workers)" 170 "$T/record.txt" env OUT="$OUT" LIMIT=160 WORKERS=6 \
    bash bench/record_triton_launches.sh
fla_aside
step "2. released q4 with fla-core: prompts of 8k..256k and the batch-1 step after each" 330 "$T/long.txt" $FLA \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --no-prefill --long-contexts 8192,32768,131072,262144 --out "$T/long_context_released_q4_fla.json"
collect "$T" "$OUT/benches.json"
