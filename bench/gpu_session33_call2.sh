#!/usr/bin/env bash
# Session 33's second device call (any GPU), <= BUDGET s, after the first (bench/gpu_session33_call1.sh) found
# top_pools' segmented kernels faster than the torch form at every count of queries (so now `"rows": 1`: a decode
# step's choice too):
# 1. the GPU tests whose steps choose pools through the serving path, graphs and drafts included, with the kernels;
# 2. the batch-1 decode step after prompts of 8k and 128k on four DSA layers (rank 0's TP=2 share, EXL3 experts, q4),
#    this tree, then a copy whose choice takes the kernels only from 512 rows (the sed: session 32's dispatch).
#     BUDGET=300 bash bench/gpu_session33_call2.sh
# (Ran on the tree of commit 597d832 with TOP_POOLS_LAUNCH's "rows" knob; it is gone since, so the sed below no longer
# changes anything: `top_pools_applies` takes every count of queries.)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s33b-out}
mkdir -p "$OUT" /tmp/s33b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s33b-steps

machine
wheels fla_core einops
step "1. the steps' pool choice by the kernels: pool keys, graphs, drafts, parity" 120 "$T/tests.txt" python -m pytest -q \
    -rfE --tb=short -p no:cacheprovider -n 3 tests/gpu/test_pool_keys_gpu.py tests/gpu/test_graphs.py \
    tests/gpu/test_cuda_parity.py tests/gpu/test_drafts_gpu.py
step "2a. b1 step after 8k / 128k prompts, DDDD, kernels for every choice" 70 "$T/decode_now.txt" python \
    bench/gpu_engine.py --layers DDDD --exl3-experts --shard 2 --dense q4 --modes none --tp2 off --no-prefill \
    --long-contexts 8192,131072 --out "$T/decode_dddd_kernels.json"
rm -rf /tmp/rows512 && mkdir -p /tmp/rows512 && cp -r engine bench /tmp/rows512/
sed -i 's|"programs": 512, "rows": 1}|"programs": 512, "rows": 512}|' /tmp/rows512/engine/ops/triton_dsa.py
grep -c '"rows": 512}' /tmp/rows512/engine/ops/triton_dsa.py | tee -a "$LOG"
step "2b. the same, the torch form below 512 rows (session 32's dispatch)" 70 "$T/decode_before.txt" env \
    PYTHONPATH=/tmp/pylib:/tmp/rows512:/tmp/rows512/bench:tests/engine:tests/gpu:tests python \
    /tmp/rows512/bench/gpu_engine.py --layers DDDD --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --no-prefill --long-contexts 8192,131072 --out "$T/decode_dddd_torch.json"
collect "$T" "$OUT/benches.json"
