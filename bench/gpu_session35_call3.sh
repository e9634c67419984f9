#!/usr/bin/env bash
# Session 35's third call (any GPU), <= BUDGET s: call 2's first two steps alone (that call's machine stopped
# answering and nothing came back): the launch-record set with the new prompt kernels, then fla-core's KDA prompts
# and the CUDA demo.
#     BUDGET=300 bash bench/gpu_session35_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s35c-out}
mkdir -p "$OUT" /tmp/s35c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s35c-steps

machine
wheels fla_core einops
fla_aside
step "1. the launch-record set" 190 "$T/record.txt" env OUT="$OUT" WORKERS=5 LIMIT=180 \
    bash bench/record_triton_launches.sh
step "2. fla-core's KDA prompts and the CUDA demo" 80 "$OUT/fla_tests.txt" $FLA python -m pytest -q \
    -p no:cacheprovider -n 2 tests/gpu/test_kda_prompt_gpu.py tests/gpu/test_cuda_parity.py
collect "$T" "$OUT/benches.json"
