#!/usr/bin/env bash
# Session 25's third call, <= BUDGET s: the GPU tests after the session's changes (fp32 control tensors, fp32 rows
# through triton_rows drafts or not, a reply's end held until its window's counts are in): the files calls 1 and 2
# did not run (jsonschema and opentelemetry now carried), the drafting tests again, then the EXL3 kernels' FMA cases.
#     BUDGET=480 bash bench/gpu_session25_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s25c-out}
mkdir -p "$OUT" /tmp/s25c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
. bench/run_steps.sh
T=/tmp/s25c-steps

machine
wheels fla_core einops
step "1. GPU tests" 260 "$OUT/gpu_tests.txt" \
    python -m pytest -q tests/gpu/test_rows_gpu.py tests/gpu/test_dense_gpu.py tests/gpu/test_prompt_forms_gpu.py \
    tests/gpu/test_reuse_gpu.py tests/gpu/test_structured_gpu.py tests/gpu/test_moe_prompt_gpu.py \
    tests/gpu/test_drafts_gpu.py tests/gpu/test_mtp_gpu.py
step "2. EXL3 kernels, FMA form" 180 "$T/gpu_tests_exl3.txt" \
    python -m pytest -q -x tests/gpu/test_exl3_gpu.py -k "not mma"
collect "$T" "$OUT/benches.json"
