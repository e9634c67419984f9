#!/usr/bin/env bash
# Session 25's first call, <= BUDGET s: the control tensors kept in fp32 (layout.kept_fp32: the routers and their
# bias, KDA's conv taps, dt_bias, A_log, the hyper-connections' base and scale, as the checkpoint stores them) — the
# GPU tests through the paths they touch, then the released depth's graphed q4 decode step against the previous tree
# (b903eba, routers read as bf16; brought as .wheels/prev/tree.tgz), and the step that may verify with its window of 4.
#     BUDGET=480 bash bench/gpu_session25_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s25a-out}
mkdir -p "$OUT" /tmp/s25a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
. bench/run_steps.sh
T=/tmp/s25a-steps
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
rm -rf /tmp/prev && mkdir -p /tmp/prev && tar xzf .wheels/prev/tree.tgz -C /tmp/prev
P="env PYTHONPATH=/tmp/pylib:/tmp/prev:/tmp/prev/bench"
step "1. GPU tests (paths the fp32 control tensors touch)" 200 "$OUT/gpu_tests.txt" \
    python -m pytest -q tests/gpu/test_cuda_parity.py tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_drafts_gpu.py \
    tests/gpu/test_rows_gpu.py tests/gpu/test_mtp_gpu.py tests/gpu/test_graphs.py
step "2. released depth decode, q4: this tree (fp32 routers)" 40 "$T/decode_now.txt" \
    python bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill --out "$T/decode45_q4_now.json"
step "3. released depth decode, q4: b903eba (routers bf16)" 40 "$T/decode_prev.txt" \
    $P python /tmp/prev/bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill \
    --out "$T/decode45_q4_prev.json"
step "4. released depth decode, q4: this tree again" 40 "$T/decode_now2.txt" \
    python bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill --out "$T/decode45_q4_now2.json"
step "5. released depth, verify window 4 (bf16 dense)" 45 "$T/rows45.txt" \
    python bench/row_invariance_cost.py $R --out "$T/rows45.json"
step "6. GPU tests, the rest but EXL3 kernels, vision and fla-core's" 100 "$T/gpu_tests_rest.txt" \
    python -m pytest -q tests/gpu/test_dense_gpu.py tests/gpu/test_prompt_forms_gpu.py tests/gpu/test_reuse_gpu.py \
    tests/gpu/test_structured_gpu.py tests/gpu/test_moe_prompt_gpu.py
collect "$T" "$OUT/benches.json"
