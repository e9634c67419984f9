#!/usr/bin/env bash
# Session 34's fifth call (any GPU), <= BUDGET s: a step that really runs out of GPU memory (tests/gpu/
# test_out_of_memory_gpu.py), then the GPU tests of the serving path it touches (prompt reuse, graphs, drafts).
#     BUDGET=240 bash bench/gpu_session34_call5.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s34e-out}
mkdir -p "$OUT" /tmp/s34e-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-240}
. bench/run_steps.sh
T=/tmp/s34e-steps

machine
wheels fla_core einops
step "1. a real out-of-memory step" 90 "$OUT/oom.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_out_of_memory_gpu.py
step "2. prompt reuse, graphs, drafts on the GPU" 200 "$OUT/serving.txt" python -m pytest -q -p no:cacheprovider \
    -n 4 tests/gpu/test_reuse_gpu.py tests/gpu/test_graphs.py tests/gpu/test_drafts_gpu.py
collect "$T" "$OUT/benches.json"
