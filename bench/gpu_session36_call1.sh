#!/usr/bin/env bash
# Session 36's first call (any GPU), <= BUDGET s. It ran (BUDGET=380, on an H100) on a tree with engine/ops/pdl.py
# (cb288af, the local branch session36-pdl), which main does not take: PDL measured no gain (docs/BENCHMARKS.md,
# session 36). That tree: session 35's branch (DSA's prompt attention with q_abs · scaling split in one launch,
# `split_scaled`, and the context written split, `SPLIT_OUT`) and programmatic dependent launch for every engine
# Triton kernel (engine/ops/pdl.py).
#  1. the selected-token GPU tests with `_attend_prompt` and `_split_scaled` recorded into the launch record
#     (record_triton_launches.sh's partial mode), PDL on;
#  2. bench/pdl_bench.py: what PDL saves a chain of short kernels;
#  3. issue 20's 4-layer bf16 decode step (graphs), PDL on, then off (a copy of this tree with pdl.WANTED = False);
#  4. issue 20's 4-layer bf16 prefill: this tree, then ccb4ac8's (.wheels/prev/tree-ccb4ac8.tgz: main before the
#     branch).
#     BUDGET=520 bash bench/gpu_session36_call1.sh
# (.wheels/prev/tree-ccb4ac8.tgz, if absent: git archive ccb4ac8 engine bench/gpu_engine.py bench/decode_trace.py
#  bench/exl3_prompt_bench.py config | gzip > .wheels/prev/tree-ccb4ac8.tgz)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s36a-out}
mkdir -p "$OUT" /tmp/s36a-steps /tmp/old /tmp/nopdl/bench
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-520}
. bench/run_steps.sh
T=/tmp/s36a-steps

machine
wheels fla_core einops
fla_aside
tar xzf .wheels/prev/tree-ccb4ac8.tgz -C /tmp/old
cp -r engine config /tmp/nopdl/ && cp bench/gpu_engine.py bench/decode_trace.py bench/exl3_prompt_bench.py /tmp/nopdl/bench/
sed -i 's/^WANTED = True$/WANTED = False/' /tmp/nopdl/engine/ops/pdl.py
grep -c "^WANTED = False" /tmp/nopdl/engine/ops/pdl.py | tee -a "$LOG"
step "1. the selected-token tests, recorded" 140 "$T/record.txt" env OUT="$OUT" WORKERS=3 LIMIT=130 \
    KERNELS="_attend_prompt _split_scaled" TESTS="tests/gpu/test_cuda_parity.py \
    tests/gpu/test_prompt_forms_gpu.py::test_prompt_attention_on_tensor_cores_matches_fp32 \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_at_the_served_widths \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_reads_the_pools_latents_in_place" \
    bash bench/record_triton_launches.sh
step "2. what PDL saves a chain of short kernels" 40 "$T/pdl.txt" python bench/pdl_bench.py --out "$T/pdl.json"
D="--layers KKKD --modes graphs --tp2 off --no-prefill"
step "3a. decode, PDL on" 80 "$T/dec_on_a.txt" python bench/gpu_engine.py $D --out "$T/dec_on_a.json"
step "3b. decode, PDL off" 70 "$T/dec_off.txt" env -C /tmp/nopdl python bench/gpu_engine.py $D --out "$T/dec_off.json"
P="--layers KKKD --modes none --tp2 off --prefill-lengths 2048,8192"
step "4a. prefill, this tree (compiles fla-core's kernels)" 150 "$T/pre_new.txt" $FLA python bench/gpu_engine.py $P \
    --out "$T/pre_new.json"
step "4b. prefill, ccb4ac8" 60 "$T/pre_old.txt" env -C /tmp/old $FLA python bench/gpu_engine.py $P --out "$T/pre_old.json"
collect "$T" "$OUT/benches.json"
