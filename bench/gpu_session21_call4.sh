#!/usr/bin/env bash
# Session 21's fourth call, <= BUDGET s: the committed code's prompt-path GPU tests (the selected-token kernel's
# launches by capability and latents, the prompt conv's kernel), the launch record, the selected-token kernel with a
# lo part at its new launch, the 4-layer prompt-chunk trace and the released depth's prefill (q4, 8k and 32k).
#     BUDGET=360 bash bench/gpu_session21_call4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s21d-out}
mkdir -p "$OUT" /tmp/s21d-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-360}
. bench/run_steps.sh
T=/tmp/s21d-steps

machine
wheels fla_core einops
fla_aside
step "1. record Triton launches (GPU tests)" 180 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=170 bash bench/record_triton_launches.sh
step "2. released depth prefill, q4" 80 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
step "3. prompt-path GPU tests" 45 "$T/prompt_tests.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_prompt_forms_gpu.py tests/gpu/test_moe_prompt_gpu.py tests/gpu/test_kda_prompt_gpu.py
step "4. DSA prompt attention, lo latents, 8k" 35 "$T/dsa_prompt.txt" \
    python bench/dsa_prompt_bench.py --contexts 8192 --latents lo --out "$T/dsa_prompt_lo.json"
step "5. prefill trace, 4 layers, EXL3, q4, 8k" 45 "$T/prefill_trace.txt" \
    $FLA python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --prefill 8192 \
    --out "$OUT/trace_prefill_kkkd_exl3_q4.json.gz"
collect "$T" "$OUT/benches.json"
