#!/usr/bin/env bash
# Session 32's second device call (an H100: the released depth does not fit its 80 GB), <= BUDGET s, after the first
# (bench/gpu_session31_call1.sh) found two GPU test files unable to import (fastapi's and openai's new dependencies
# were not in .wheels) and two failures its output did not name:
# 1. the GPU tests that launch every kernel, recording the Triton launches (their failures in record_tests.txt);
# 2. the indexer alone with bf16 and fp8 pool keys at 32k and 128k: a prompt chunk's q parts now take 128 pools a
#    program on Hopper (INDEX_LAUNCH_SM90_PARTS; 64 the variant "pools64");
# 3. one DSA layer's 2k prompt chunk at 32k..1M spans with that launch (the first call's figures are the before),
#    each case's kernels by their time (--profile);
# 4. a prompt chunk's pool choice by top_pools' new kernel (a radix select, a program a query) against the torch form.
#     BUDGET=390 bash bench/gpu_session32_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s32a-out}
mkdir -p "$OUT" /tmp/s32a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-390}
. bench/run_steps.sh
T=/tmp/s32a-steps

machine
wheels fla_core einops
step "1. record Triton launches (the GPU tests that launch every kernel, 6 workers)" 200 "$T/record.txt" \
    env OUT="$OUT" LIMIT=190 WORKERS=6 bash bench/record_triton_launches.sh
step "2. the indexer alone: bf16 / fp8 pool keys, 32k and 128k, the served launch and its variants" 45 \
    "$T/index.txt" python bench/dsa_prompt_bench.py --index --contexts 32768,131072 --keys bf16,fp8 \
    --out "$T/dsa_index.json"
step "3. a DSA layer's 2k prompt chunk at 32k..1M spans" 100 "$T/long_prompt.txt" python bench/long_prompt_bench.py \
    --spans 32768,131072,524288,1048576 --kv bf16,fp8 --profile --out "$T/long_prompt_bench.json"
step "4. a prompt chunk's pool choice: top_pools' kernel against its torch form, 32k..512k" 50 "$T/pool_keys.txt" \
    python bench/pool_keys_bench.py --spans 32768,131072,524288 --kv bf16 --out "$T/pool_keys_bench.json"
collect "$T" "$OUT/benches.json"
