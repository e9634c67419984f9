#!/usr/bin/env bash
# Session 32's last device call (what device time was left after failed starts), <= BUDGET s: only the GPU tests
# that failed in the second call's record (the fp8 forms that must give the same bits: the indexer's step over e4m3
# keys in place against a chunk's bf16 copy, now widened to fp32 before bf16; the lane attention's fp8 latents in place
# against the gathered copy, now compiled without FMA contraction), their bf16 and fp32 counterparts, and top_pools'
# kernel on a prompt chunk's rows.
#     BUDGET=110 bash bench/gpu_session32_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s32c-out}
mkdir -p "$OUT" /tmp/s32c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-110}
. bench/run_steps.sh
T=/tmp/s32c-steps

machine
wheels fla_core einops
step "1. the fp8 forms' bits and top_pools' kernel" 95 "$T/tests.txt" python -m pytest -q -rfE --tb=short \
    -p no:cacheprovider -n 2 "tests/gpu/test_rows_gpu.py::test_indexer_scores_at_the_served_shapes" \
    "tests/gpu/test_rows_gpu.py::test_lane_attention_reads_the_pools_latents_in_place" \
    "tests/gpu/test_pool_keys_gpu.py::test_top_pools_kernel_takes_the_same_pools_for_a_prompt_chunks_rows"
collect "$T" "$OUT/benches.json"
