#!/usr/bin/env bash
# Session 25's second call, <= BUDGET s: an fp32 weight's few CUDA rows through triton_rows whether drafts may come or
# not (call 1: the fp32 routers through cuBLAS made the drafts-off q4 step 0.9 % longer at b1, 2.8 % at b4) — the
# released depth's graphed q4 decode step, this tree and b903eba (.wheels/prev/tree.tgz) in turn; then the GPU tests
# call 1 could not import (jsonschema now carried) and the rows kernel's.
#     BUDGET=420 bash bench/gpu_session25_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s25b-out}
mkdir -p "$OUT" /tmp/s25b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-420}
. bench/run_steps.sh
T=/tmp/s25b-steps
R="--layers released --exl3-experts --shard 2"
D="--dense q4 --modes graphs --tp2 off --no-prefill"

machine
wheels fla_core einops
rm -rf /tmp/prev && mkdir -p /tmp/prev && tar xzf .wheels/prev/tree.tgz -C /tmp/prev
P="env PYTHONPATH=/tmp/pylib:/tmp/prev:/tmp/prev/bench"
for i in 1 2; do
    step "decode q4, this tree ($i)" 40 "$T/now$i.txt" python bench/gpu_engine.py $R $D --out "$T/decode45_q4_now$i.json"
    step "decode q4, b903eba ($i)" 40 "$T/prev$i.txt" \
        $P python /tmp/prev/bench/gpu_engine.py $R $D --out "$T/decode45_q4_prev$i.json"
done
step "GPU tests" 230 "$OUT/gpu_tests.txt" \
    python -m pytest -q tests/gpu/test_rows_gpu.py tests/gpu/test_dense_gpu.py tests/gpu/test_prompt_forms_gpu.py \
    tests/gpu/test_reuse_gpu.py tests/gpu/test_structured_gpu.py tests/gpu/test_moe_prompt_gpu.py
collect "$T" "$OUT/benches.json"
