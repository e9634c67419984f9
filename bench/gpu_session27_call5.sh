#!/usr/bin/env bash
# Session 27's fifth call, <= BUDGET s: the final tree — tests/gpu but test_exl3_gpu.py (its kernels untouched this
# session) on 8 xdist workers, fla-core left out (as bench/gpu_suite_run.sh's first step), with the MTP layer's first
# draft under a format's mask (tests/gpu/test_mtp_gpu.py) and the dense launch table (test_dense_gpu.py) among them;
# then the served model's MTP-drafted verify windows (the mask applied in every MTP step: its cost beside session
# 26's call 5).
#     BUDGET=440 bash bench/gpu_session27_call5.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s27e-out}
mkdir -p "$OUT" /tmp/s27e-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-440}
. bench/run_steps.sh
T=/tmp/s27e-steps

machine
wheels fla_core einops
step "1. tests/gpu but test_exl3_gpu.py, -n 8 --dist loadfile" 300 "$OUT/gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider -n 8 --dist loadfile --durations=10 tests/gpu \
    --ignore=tests/gpu/test_exl3_gpu.py
step "2. verify windows, released q4, MTP-drafted" 120 "$T/verify.txt" python bench/verify_bench.py \
    --layers released --exl3-experts --shard 2 --dense q4 --mtp --out "$T/verify_released_q4_mtp.json"
collect "$T" "$OUT/benches.json"
