#!/usr/bin/env bash
# Session 24's fourth call, <= BUDGET s: the EXL3 decode GEMV's two forms with the committed launches — the GPU
# tests not reached in calls 1-2 (each row's bits in any of the MMA's columns; the expert bank on the device; a
# row's result whatever the batch), then bench/exl3_gemv_bench.py at TP=2's shard and at TP=1.
#     BUDGET=300 bash bench/gpu_session24_call4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s24d-out}
mkdir -p "$OUT" /tmp/s24d-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s24d-steps

machine
wheels fla_core einops
step "1. EXL3 GPU tests" 90 "$OUT/gpu_tests.txt" \
    python -m pytest -q tests/gpu/test_exl3_gpu.py -k "column or bank or batch or forward or inline"
step "2. GEMV forms, TP=2 shard" 90 "$T/gemv_forms_shard2.txt" \
    python bench/exl3_gemv_bench.py --shard 2 --budget 80 --out "$T/gemv_forms_shard2.json"
step "3. GEMV forms, TP=1" 90 "$T/gemv_forms_shard1.txt" \
    python bench/exl3_gemv_bench.py --shard 1 --budget 80 --out "$T/gemv_forms_shard1.json"
collect "$T" "$OUT/benches.json"
