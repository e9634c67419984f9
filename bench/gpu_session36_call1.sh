#!/usr/bin/env bash
# Session 36's first call (any GPU), <= BUDGET s: session 35's branch (DSA's prompt attention with q_abs · scaling
# split in one launch, `split_scaled`, and the context written split, `SPLIT_OUT`): its selected-token GPU tests with
# `_attend_prompt` and `_split_scaled` recorded into the launch record (record_triton_launches.sh's partial mode),
# then issue 20's 4-layer bf16 prefill with this tree and ccb4ac8's (.wheels/prev/tree-ccb4ac8.tgz: main before the
# branch) in turn; then bench/pdl_bench.py.
#     BUDGET=480 bash bench/gpu_session36_call1.sh
# (.wheels/prev/tree-ccb4ac8.tgz, if absent: git archive ccb4ac8 engine bench/gpu_engine.py bench/decode_trace.py
#  bench/exl3_prompt_bench.py config | gzip > .wheels/prev/tree-ccb4ac8.tgz)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s36a-out}
mkdir -p "$OUT" /tmp/s36a-steps /tmp/old
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
. bench/run_steps.sh
T=/tmp/s36a-steps

machine
wheels fla_core einops
fla_aside
tar xzf .wheels/prev/tree-ccb4ac8.tgz -C /tmp/old
step "1. the selected-token tests, recorded" 150 "$T/record.txt" env OUT="$OUT" WORKERS=3 LIMIT=140 \
    KERNELS="_attend_prompt _split_scaled" TESTS="tests/gpu/test_cuda_parity.py \
    tests/gpu/test_prompt_forms_gpu.py::test_prompt_attention_on_tensor_cores_matches_fp32 \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_at_the_served_widths \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_reads_the_pools_latents_in_place" \
    bash bench/record_triton_launches.sh
P="--layers KKKD --modes none --tp2 off --prefill-lengths 2048,8192"
step "2. prefill, this tree (compiles fla-core's kernels)" 150 "$T/new_a.txt" $FLA python bench/gpu_engine.py $P \
    --out "$T/new_a.json"
step "3. prefill, ccb4ac8" 60 "$T/old_a.txt" env -C /tmp/old $FLA python bench/gpu_engine.py $P --out "$T/old_a.json"
step "4. prefill, this tree again" 50 "$T/new_b.txt" $FLA python bench/gpu_engine.py $P --out "$T/new_b.json"
step "5. what PDL saves a chain of short kernels" 40 "$T/pdl.txt" python bench/pdl_bench.py --out "$T/pdl.json"
collect "$T" "$OUT/benches.json"
