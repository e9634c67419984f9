#!/usr/bin/env bash
# Session 33's third device call (any GPU), <= BUDGET s: the second call's 128k prompt on four DSA layers took 6.4 s
# with top_pools' kernels for every block against 4.4 s with the torch form below 512 rows, the kernels' run first on
# a cold Triton cache (its 8k prompt 9.3 s against 1.5). The same bench twice in one process tree here: the first
# run compiles, the second is timed warm; then the torch-below-512 copy.
#     BUDGET=200 bash bench/gpu_session33_call3.sh
# (Ran on the tree of commit 597d832 with TOP_POOLS_LAUNCH's "rows" knob; it is gone since, so the sed below no longer
# changes anything: `top_pools_applies` takes every count of queries.)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s33c-out}
mkdir -p "$OUT" /tmp/s33c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-200}
. bench/run_steps.sh
T=/tmp/s33c-steps

machine
wheels fla_core einops
for run in cold warm; do
    step "kernels for every block ($run Triton cache)" 60 "$T/decode_$run.txt" python bench/gpu_engine.py \
        --layers DDDD --exl3-experts --shard 2 --dense q4 --modes none --tp2 off --no-prefill \
        --long-contexts 8192,131072 --out "$T/decode_dddd_kernels_$run.json"
done
rm -rf /tmp/rows512 && mkdir -p /tmp/rows512 && cp -r engine bench /tmp/rows512/
sed -i 's|"programs": 512, "rows": 1}|"programs": 512, "rows": 512}|' /tmp/rows512/engine/ops/triton_dsa.py
step "the torch form below 512 rows" 60 "$T/decode_before.txt" env \
    PYTHONPATH=/tmp/pylib:/tmp/rows512:/tmp/rows512/bench:tests/engine:tests/gpu:tests python \
    /tmp/rows512/bench/gpu_engine.py --layers DDDD --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --no-prefill --long-contexts 8192,131072 --out "$T/decode_dddd_torch.json"
collect "$T" "$OUT/benches.json"
