#!/usr/bin/env bash
# Session 21's third call, <= BUDGET s: the prompt-path GPU tests with the selected-token kernel's launches by
# capability and latents, the kernel's launches for bf16 latents and latents with a lo part (8k), the launch record,
# and the DENSE modes' quality at full width again (issue 19: the table predates session 18's dense kernels).
#     BUDGET=540 bash bench/gpu_session21_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s21c-out}
mkdir -p "$OUT" /tmp/s21c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}
. bench/run_steps.sh
T=/tmp/s21c-steps

machine
wheels fla_core einops
step "1. prompt-path GPU tests" 60 "$T/prompt_tests.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_prompt_forms_gpu.py tests/gpu/test_moe_prompt_gpu.py
step "2. DSA prompt attention, bf16 and lo latents, 8k" 70 "$T/dsa_prompt.txt" \
    python bench/dsa_prompt_bench.py --contexts 8192 --latents bf16,lo --out "$T/dsa_prompt.json"
step "3. record Triton launches (GPU tests)" 190 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=180 bash bench/record_triton_launches.sh
step "4. dense modes' quality at full width" 300 "$T/quality_dense.txt" python bench/quality_full_width.py --tokens 512 \
    --continuation 48 --mode dense=fp8 --mode dense=q4 --mode dense=q4,kv=fp8,kda=chunked --out "$T/quality_dense.json"
collect "$T" "$OUT/benches.json"
