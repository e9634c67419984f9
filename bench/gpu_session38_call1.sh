#!/usr/bin/env bash
# Session 38's call for the next device time (any GPU), <= BUDGET s. Session 38 had none; this runs what it left:
#  1. the GPU tests of rank 0 sampling a decode step's rows on the GPU (test_sampling_gpu: the device draws the host's
#     tokens) and of the serving paths that sample there (drafts, MTP, structured outputs);
#  2. session 37's prompt-path GPU tests with the log-decay made in fla-core (never run on a GPU with it on);
#  3. bench/sampling_bench.py with the rows on the GPU (ms a row), and bench/served_decode_bench.py: decode through
#     the scheduler at 154,880 tokens, 4 full-width layers, sampled on the GPU and, in turn, on the host (before).
# On an H100 fla-core reads the H200's shipped choices (none are shipped for an H100: it would autotune for minutes).
#     BUDGET=480 bash bench/gpu_session38_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s38-out}
mkdir -p "$OUT" /tmp/s38-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
. bench/run_steps.sh
T=/tmp/s38-steps

machine
[ -d /tmp/pylib/fastapi ] || wheels fla_core einops
fla_aside
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then
    export FLA_CACHE_MODE=strict FLA_CONFIG_DIR="$PWD/engine/ops/fla_configs/NVIDIA_H200"
fi
step "1. sampling on the GPU, and the paths that sample there" 150 "$T/sampling_tests.txt" python -m pytest -q \
    -p no:cacheprovider tests/gpu/test_sampling_gpu.py tests/gpu/test_drafts_gpu.py tests/gpu/test_mtp_gpu.py \
    tests/gpu/test_structured_gpu.py
step "2. the prompt path with fla-core's gate" 150 "$T/prompt_tests.txt" $FLA python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_kda_prompt_gpu.py tests/gpu/test_cuda_parity.py tests/gpu/test_reuse_gpu.py \
    tests/gpu/test_prompt_forms_gpu.py::test_the_gated_norm_at_the_served_width
step "3a. a row sampled on the GPU" 40 "$T/sampling_gpu.txt" python bench/sampling_bench.py --device cuda \
    --calls 30 --out "$T/sampling_gpu.json"
step "3b. a row sampled on the host" 60 "$T/sampling_cpu.txt" python bench/sampling_bench.py --calls 30 \
    --out "$T/sampling_cpu.json"
step "3c. decode through the scheduler" 130 "$T/served.txt" python bench/served_decode_bench.py --layers KKKD \
    --lanes 1,4 --tokens 96 --host-sampling --out "$T/served_decode.json"
collect "$T" "$OUT/benches.json"
