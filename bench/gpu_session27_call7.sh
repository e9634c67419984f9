#!/usr/bin/env bash
# Session 27's seventh call, <= BUDGET s: the review's mends on the GPU — tests/gpu/test_dense_gpu.py (an fp8 LM
# head's own launch at its default), test_mtp_gpu.py (the masked first MTP draft with graphs; int32 ids in the mask)
# and test_structured_gpu.py, on 3 xdist workers.
#     BUDGET=300 bash bench/gpu_session27_call7.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s27g-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. test_dense_gpu, test_mtp_gpu, test_structured_gpu" 240 "$OUT/gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile tests/gpu/test_dense_gpu.py \
    tests/gpu/test_mtp_gpu.py tests/gpu/test_structured_gpu.py
say "## done after $(( $(date +%s) - START )) s"
