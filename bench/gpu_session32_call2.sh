#!/usr/bin/env bash
# Session 32's third device call (an H100), <= BUDGET s, after the second (bench/gpu_session32_call1.sh) found three
# GPU tests failing: two fp8 forms that must give the same bits (the indexer's step over e4m3 keys in place against
# a chunk's bf16 copy; the lane attention's fp8 latents in place against the gathered copy) — now the e4m3 keys
# widened to fp32 before bf16, and the lane attention compiled without FMA contraction — and one out of GPU memory
# with six workers on the H100's 80 GB:
# 1. test_rows_gpu.py, test_pool_keys_gpu.py (top_pools' kernel) and the full-width row invariance, 3 workers;
# 2. one DSA layer's 2k prompt chunk at 128k and 1M (bf16 rows), its kernels by their time (--profile).
#     BUDGET=205 bash bench/gpu_session32_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s32b-out}
mkdir -p "$OUT" /tmp/s32b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-205}
. bench/run_steps.sh
T=/tmp/s32b-steps

machine
wheels fla_core einops
step "1. the fp8 forms' bits, top_pools' kernel, row invariance at full width" 125 "$T/tests.txt" \
    python -m pytest -q -rfE --tb=short -p no:cacheprovider -n 3 tests/gpu/test_rows_gpu.py \
    tests/gpu/test_pool_keys_gpu.py "tests/gpu/test_drafts_gpu.py::test_rows_are_invariant_at_full_width"
step "2. a DSA layer's 2k prompt chunk at 128k and 1M, profiled" 70 "$T/long_prompt.txt" python \
    bench/long_prompt_bench.py --spans 131072,1048576 --kv bf16 --repeats 2 --profile --out "$T/long_prompt_bench.json"
collect "$T" "$OUT/benches.json"
