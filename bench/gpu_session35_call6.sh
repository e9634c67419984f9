#!/usr/bin/env bash
# Session 35's sixth call (any GPU), <= BUDGET s: DSA's prompt attention with q_abs · scaling split in one launch
# (`split_scaled`) and the context written split (`SPLIT_OUT`): the selected-token GPU tests (among them the served
# path's bits against the torch splits around the fp32 kernel) and the CUDA demo, recording `_attend_prompt` and
# `_split_scaled` into the committed launch record (bench/record_triton_launches.sh's partial mode).
#     BUDGET=170 bash bench/gpu_session35_call6.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s35f-out}
mkdir -p "$OUT" /tmp/s35f-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-170}
. bench/run_steps.sh
T=/tmp/s35f-steps

machine
wheels fla_core einops
step "1. the selected-token tests, recorded" 150 "$T/record.txt" env OUT="$OUT" WORKERS=3 LIMIT=140 \
    KERNELS="_attend_prompt _split_scaled" TESTS="tests/gpu/test_cuda_parity.py \
    tests/gpu/test_prompt_forms_gpu.py::test_prompt_attention_on_tensor_cores_matches_fp32 \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_at_the_served_widths \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_reads_the_pools_latents_in_place" \
    bash bench/record_triton_launches.sh
collect "$T" "$OUT/benches.json"
