#!/usr/bin/env bash
# Session 28's device call, written when no device was lent (run it in the next session that has one), <= BUDGET s:
# DSA's stored pool keys on the GPU — the tests whose bits depend on them (drafted ≡ serial with graphs, lanes ≡
# plain, the MTP layer's rows), the indexer's key read before and after at 4k..512k spans for each cache row type
# and the pool choice by sort and by ops.top_pools (session 29) for a step and a 2,048-query chunk
# (bench/pool_keys_bench.py, CUDA graphs), then the Triton launches recorded again (tests/fixtures/triton_launches.json holds hand-written `_pool_key_rows` entries
# until then: copy $OUT/triton_launches.json over it).
#     BUDGET=590 bash bench/gpu_session28_call1.sh    (then bench/gpu_session29_call2.sh: the long-context runs)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s28a-out}
mkdir -p "$OUT" /tmp/s28a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh
T=/tmp/s28a-steps

machine
wheels fla_core einops
step "1. tests/gpu but test_exl3_gpu.py, -n 8 --dist loadfile" 300 "$OUT/gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider -n 8 --dist loadfile --durations=10 tests/gpu \
    --ignore=tests/gpu/test_exl3_gpu.py
step "2. the indexer's keys and the pool choice, before / after, 4k..512k" 120 "$T/pool_keys.txt" python bench/pool_keys_bench.py \
    --spans 4096,32768,131072,524288 --out "$T/pool_keys_bench.json"
step "3. record Triton launches (GPU tests)" 200 "$T/record.txt" env OUT="$OUT" LIMIT=190 \
    bash bench/record_triton_launches.sh
collect "$T" "$OUT/benches.json"
