#!/usr/bin/env bash
# Session 25's fourth call, <= BUDGET s: the GPU tests call 3 could not run (xgrammar's tvm_ffi now carried; the rows
# dispatch test as changed), then fla-core's autotune for the KDA prompt kernels at GLM-5.3-Flash's TP=2 shard shape
# (32 heads of 128) recorded in fla-core's config format (bench/fla_configs.py record, back as fla_configs.tgz), and
# a first start timed in fresh processes with fresh Triton caches reading them (FLA_CACHE_MODE=fuzzy): at 32 heads,
# and at 22 (TP=3's rank 0) to see the fuzzy match take another head count.
#     BUDGET=480 bash bench/gpu_session25_call4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s25d-out}
mkdir -p "$OUT" /tmp/s25d-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
. bench/run_steps.sh
T=/tmp/s25d-steps

machine
wheels fla_core einops
fla_aside
step "1. GPU tests" 90 "$OUT/gpu_tests.txt" \
    python -m pytest -q tests/gpu/test_rows_gpu.py tests/gpu/test_structured_gpu.py
step "2. fla-core autotune recorded (32 heads)" 260 "$T/record.txt" \
    env TRITON_CACHE_DIR=/tmp/tc-record $FLA python bench/fla_configs.py record --heads 32 --head-dim 128 \
    --out /tmp/flacfg
tar czf "$OUT/fla_configs.tgz" -C /tmp/flacfg . 2>/dev/null
say "$(ls /tmp/flacfg 2>/dev/null | tr '\n' ' ')"
step "3. first start reading them (32 heads, fresh Triton cache)" 90 "$T/time32.txt" \
    env TRITON_CACHE_DIR=/tmp/tc-32 FLA_CACHE_MODE=fuzzy FLA_CONFIG_DIR=/tmp/flacfg $FLA \
    python bench/fla_configs.py time --heads 32 --head-dim 128 --out "$T/fla_time32.json"
step "4. first start reading them (22 heads, fresh Triton cache)" 90 "$T/time22.txt" \
    env TRITON_CACHE_DIR=/tmp/tc-22 FLA_CACHE_MODE=fuzzy FLA_CONFIG_DIR=/tmp/flacfg $FLA \
    python bench/fla_configs.py time --heads 22 --head-dim 128 --out "$T/fla_time22.json"
collect "$T" "$OUT/benches.json"
