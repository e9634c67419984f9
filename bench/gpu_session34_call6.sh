#!/usr/bin/env bash
# Session 34's sixth call (any GPU), <= BUDGET s: the launch-record set of GPU tests (bench/record_triton_launches.sh:
# every engine Triton kernel, the fp8 indexer's step ≡ chunk among them) with 5 workers, then the out-of-memory and
# prompt-reuse GPU tests after the review's mends (rows given back when a device tensor cannot be made; a kept state
# copied before it is recorded).
#     BUDGET=420 bash bench/gpu_session34_call6.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s34f-out}
mkdir -p "$OUT" /tmp/s34f-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-420}
. bench/run_steps.sh
T=/tmp/s34f-steps

machine
wheels fla_core einops
step "1. the launch-record set" 250 "$T/record.txt" env OUT="$OUT" WORKERS=5 LIMIT=240 \
    bash bench/record_triton_launches.sh
step "2. out of memory, prompt reuse on the GPU" 120 "$OUT/oom_reuse.txt" python -m pytest -q -p no:cacheprovider \
    -n 3 tests/gpu/test_out_of_memory_gpu.py tests/gpu/test_reuse_gpu.py
collect "$T" "$OUT/benches.json"
