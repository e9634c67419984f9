#!/usr/bin/env bash
# Session 21's second call, <= BUDGET s: the launch record with the selected-token kernel launched by capability
# (its GPU test included), the kernel's launches again, the prompt-path GPU tests, the 4-layer prompt-chunk trace and
# the released depth's prefill (q4, 8k and 32k).
#     BUDGET=420 bash bench/gpu_session21_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s21b-out}
mkdir -p "$OUT" /tmp/s21b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-420}
. bench/run_steps.sh
T=/tmp/s21b-steps

machine
wheels fla_core einops
fla_aside
step "1. record Triton launches (GPU tests)" 200 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=190 bash bench/record_triton_launches.sh
step "2. DSA prompt attention: kernel against gathered" 90 "$T/dsa_prompt.txt" \
    python bench/dsa_prompt_bench.py --contexts 8192,32768 --out "$T/dsa_prompt.json"
step "3. prompt-path GPU tests" 60 "$T/prompt_tests.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_prompt_forms_gpu.py tests/gpu/test_moe_prompt_gpu.py
step "4. prefill trace, 4 layers, EXL3, q4, 8k" 60 "$T/prefill_trace.txt" \
    $FLA python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --prefill 8192 \
    --out "$OUT/trace_prefill_kkkd_exl3_q4.json.gz"
step "5. released depth prefill, q4" 90 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
collect "$T" "$OUT/benches.json"
