#!/usr/bin/env bash
# Session 13's H200 call, ≤ BUDGET s: EXL3 prompt experts on the tensor cores (engine/ops/triton_exl3.grouped_experts)
# — the EXL3 GPU tests, the prompt-chunk bench against the expert loop and bf16 grouped GEMMs, then the Triton
# launch record (tests/fixtures/triton_launches.json, for tests/engine/test_gb10_compile.py).
#     BUDGET=570 bash bench/gpu_session13_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s13-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-570}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. EXL3 GPU tests" 170 "$OUT/exl3_tests.txt" python -m pytest -q -rf -p no:cacheprovider \
    tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_exl3_gpu.py
step "2. EXL3 prompt bench" 200 "$OUT/exl3_prompt.txt" python bench/exl3_prompt_bench.py --budget 120 \
    --out "$OUT/exl3_prompt.json"
step "3. Triton launch record" 180 "$OUT/record.txt" env OUT="$OUT" LIMIT=170 bash bench/record_triton_launches.sh
say "## done after $(( $(date +%s) - START )) s"
