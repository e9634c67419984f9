#!/usr/bin/env bash
# Fourth call (session 9), fla-core left out (no autotune), ≤ BUDGET s: the GPU tests whose prompts reach the MoE's
# prompt path, after the grouped GEMMs landed (bf16 experts only; fp32 keeps the loop)
#     BUDGET=300 bash bench/gpu_mtp_run4.sh                                                       -> gpu_tests.txt
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtp-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. tests/gpu" 260 "$OUT/gpu_tests.txt" \
    python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_moe_prompt_gpu.py tests/gpu/test_cuda_parity.py \
    tests/gpu/test_kda_prompt_gpu.py tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_structured_gpu.py
say "## done after $(( $(date +%s) - START )) s"
