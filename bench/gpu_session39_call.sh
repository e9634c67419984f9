#!/usr/bin/env bash
# Session 39's device call (any GPU), <= BUDGET s: a decode step's rows sampled together on the GPU (`sample_rows`,
# the scheduler's `_draw`):
#  1. the GPU tests of sampling (the rows together draw the host's tokens) and of the serving paths that sample on
#     the GPU (drafts, MTP, structured outputs, prompt reuse: the scheduler's own path);
#  2. bench/sampling_bench.py on the GPU (a row alone; 4 and 16 rows together, ms a row);
#  3. bench/served_decode_bench.py: decode through the scheduler at 154,880 tokens, 4 full-width layers, the rows
#     sampled together and, in turn, a row at a time (session 38's path).
#  4. what time is left: session 37's prompt tests with fla-core's gate (cut short by session 39's first call while in
#     test_cuda_greedy_with_fla_prompts_equals_cpu; on an H100 with the H200's shipped fla-core choices).
#     BUDGET=400 bash bench/gpu_session39_call.sh      (TESTS_K="..." narrows step 1's tests)
#     BUDGET=900 bash bench/gpu_session39_call.sh      (the next session's first call: every step)
#     STEPS=14 BUDGET=480 bash bench/gpu_session39_call.sh   (only the steps named: here the tests)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s39-out}
mkdir -p "$OUT" /tmp/s39-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-400}
STEPS=${STEPS:-1234}
. bench/run_steps.sh
T=/tmp/s39-steps
rm -f "$T"/*

machine
rm -rf /tmp/pylib
wheels fla_core einops
want 1 && step "1. sampling on the GPU, and the paths that sample there" 200 "$T/a_tests.txt" python -m pytest -q \
    -p no:cacheprovider tests/gpu/test_sampling_gpu.py tests/gpu/test_drafts_gpu.py tests/gpu/test_mtp_gpu.py \
    tests/gpu/test_structured_gpu.py tests/gpu/test_reuse_gpu.py ${TESTS_K:+-k "$TESTS_K"}
want 2 && step "2. sampling_bench on the GPU" 60 "$T/b_sampling.txt" python bench/sampling_bench.py --device cuda \
    --calls 30 --out "$T/sampling_gpu.json"
want 3 && step "3. decode through the scheduler" 150 "$T/c_served.txt" python bench/served_decode_bench.py --layers KKKD \
    --lanes 1,4,16 --tokens 96 --repeats 2 --row-at-a-time --out "$T/served_decode.json"
fla_aside
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then
    export FLA_CACHE_MODE=strict FLA_CONFIG_DIR="$PWD/engine/ops/fla_configs/NVIDIA_H200"
fi
want 4 && step "4. the prompt path with fla-core's gate" 400 "$T/d_prompt_tests.txt" $FLA python -m pytest -q \
    -p no:cacheprovider --durations=0 tests/gpu/test_kda_prompt_gpu.py tests/gpu/test_cuda_parity.py \
    tests/gpu/test_prompt_forms_gpu.py::test_the_gated_norm_at_the_served_width
collect "$T" "$OUT/benches.json"
