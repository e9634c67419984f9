#!/usr/bin/env bash
# Session 42's DSA call (any GPU), <= BUDGET s: a prompt chunk's attention over selected tokens with the heads as the
# products' tall side (`triton_dsa._attend_prompt` HEADS_M, PROMPT_LAUNCHES "other" / "other_lo": a GB10's launch):
#  1. the GPU tests of the selected-token kernel (every launch of PROMPT_LAUNCHES at the served widths; the pools'
#     latents in place), recording their Triton launches (bench/record_triton_launches.sh: the fixture's
#     `_attend_prompt` entries);
#  2. bench/dsa_prompt_bench.py at 8k and 32k, bf16 latents and with a lo part: the GB10's launch now ("launch_other",
#     "launch_other_lo") beside its launch before ("gb10_before"), on mma.sync here, and this GPU's own.
#     BUDGET=300 bash bench/gpu_session42_call2.sh      (STEPS=2: only the bench)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s42-out}
mkdir -p "$OUT" /tmp/s42-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
STEPS=${STEPS:-12}
. bench/run_steps.sh
T=/tmp/s42-steps
rm -f "$T"/*

machine
wheels fla_core einops
want 1 && step "1. the selected-token kernel on the GPU, recorded" 150 "$T/a_tests.txt" env OUT="$OUT" LIMIT=140 \
    TESTS="tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_at_the_served_widths \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_reads_the_pools_latents_in_place" \
    KERNELS="_attend_prompt" bash bench/record_triton_launches.sh
want 2 && step "2. dsa_prompt_bench, 8k and 32k" 130 "$T/b_bench.txt" python bench/dsa_prompt_bench.py \
    --contexts 8192,32768 --latents bf16,lo --out "$T/dsa_prompt.json"
collect "$T" "$OUT/benches.json"
