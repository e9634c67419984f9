#!/usr/bin/env bash
# Session 22's third call, <= BUDGET s: the launch record (its GPU tests include the EXL3 prompt experts' forms),
# the grouped-experts bench (with the rotation before gate‖up timed alone by rows a program), the released depth's
# prefill (q4, 8k and 32k).
#     BUDGET=500 bash bench/gpu_session22_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s22c-out}
mkdir -p "$OUT" /tmp/s22c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-500}
. bench/run_steps.sh
T=/tmp/s22c-steps

machine
wheels fla_core einops
fla_aside
step "1. record Triton launches (GPU tests)" 300 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=290 bash bench/record_triton_launches.sh
step "2. grouped EXL3 experts bench" 150 "$T/exl3_prompt.txt" \
    python bench/exl3_prompt_bench.py --tokens 2048,8192 --tp 2,1 --budget 130 --out "$T/exl3_prompt.json"
step "3. released depth prefill, q4" 90 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
collect "$T" "$OUT/benches.json"
