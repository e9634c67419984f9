#!/usr/bin/env bash
# Session 37's second call (any GPU), <= BUDGET s, with KDA prompt chunks in the served form (the log-decay made in
# fla-core's gate kernel, fla_kda.GATE_IN_KERNEL) and the gate kernel's shipped choices:
#  1. the GPU tests of the shipped fla-core choices (a fresh first start reads them, the served form included) and of
#     the prompt path: KDA (fla-core), CUDA parity, prompt reuse, the gated norm;
#  2. issue 20's 4-layer bf16 prefill (2k / 8k), this tree and 3c27829's (.wheels/prev/tree-3c27829.tgz), in turn;
#  3. this tree's 2,048-token chunk ending at 8,192, every kernel.
#     BUDGET=300 bash bench/gpu_session37_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s37b-out}
mkdir -p "$OUT" /tmp/s37b-steps /tmp/old
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s37b-steps

machine
[ -d /tmp/pylib/fastapi ] || wheels fla_core einops
fla_aside
[ -d /tmp/old/engine ] || tar xzf .wheels/prev/tree-3c27829.tgz -C /tmp/old
step "1a. the shipped fla-core choices" 130 "$T/fla_configs_tests.txt" $FLA python -m pytest -q -x -p no:cacheprovider \
    tests/gpu/test_fla_configs_gpu.py
step "1b. the prompt path's GPU tests" 150 "$T/prompt_tests.txt" $FLA python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_kda_prompt_gpu.py tests/gpu/test_cuda_parity.py tests/gpu/test_reuse_gpu.py \
    tests/gpu/test_prompt_forms_gpu.py::test_the_gated_norm_at_the_served_width
P="--layers KKKD --modes none --tp2 off --prefill-lengths 2048,8192"
step "2a. prefill, this tree" 70 "$T/pre_new.txt" $FLA python bench/gpu_engine.py $P --out "$T/pre_new.json"
step "2b. prefill, 3c27829" 60 "$T/pre_old.txt" env -C /tmp/old $FLA python bench/gpu_engine.py $P --out "$T/pre_old.json"
step "3. the 8k chunk traced" 50 "$T/trace_pre.txt" $FLA python bench/decode_trace.py --layers KKKD --prefill 8192 \
    --out "$OUT/trace_prefill_kkkd_bf16.json.gz"
collect "$T" "$OUT/benches.json"
