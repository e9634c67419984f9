#!/usr/bin/env bash
# Session 20's third call, <= BUDGET s (at most 8 files come back):
#     BUDGET=450 bash bench/gpu_session20_call3.sh
# 1. bench/record_triton_launches.sh (its GPU tests, fla-core left out) -> triton_launches.json, then the prompt-path
# GPU tests; 2. bench/exl3_prompt_bench.py at TP=2's shard (the new defaults against session 19's); 3. the 4-layer
# prompt chunk traced (bench/decode_trace.py --prefill); 4. the released depth's prefill, q4, 8k and 32k.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s20c-out}
mkdir -p "$OUT" /tmp/s20c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-450}
. bench/run_steps.sh
T=/tmp/s20c-steps

machine
wheels fla_core einops
fla_aside
step "1. record Triton launches (GPU tests)" 200 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=190 bash bench/record_triton_launches.sh
step "1b. prompt-path GPU tests" 60 "$T/prompt_tests.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_prompt_forms_gpu.py tests/gpu/test_moe_prompt_gpu.py
step "2. EXL3 prompt experts, TP=2 shard" 70 "$T/exl3_prompt.txt" \
    python bench/exl3_prompt_bench.py --tp 2 --tokens 2048,8192 --budget 45 --no-bf16 --out "$T/exl3_prompt.json"
step "3. prefill trace, 4 layers, EXL3, q4, 8k" 60 "$T/prefill_trace.txt" \
    $FLA python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --prefill 8192 \
    --out "$OUT/trace_prefill_kkkd_exl3_q4.json.gz"
step "4. released depth prefill, q4" 100 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
collect "$T" "$OUT/benches.json"
