#!/usr/bin/env bash
# Session 24's first call, <= BUDGET s: the EXL3 decode GEMV on the tensor cores (triton_exl3._exl3_gemv_mma) — its
# GPU tests (both forms, every format and row count, row invariance; the MoE through both paths), the two forms side
# by side at TP=2's expert shard with the mma form's launch sweep, and the released depth's graphed decode with each
# form (q4 dense).
#     BUDGET=560 bash bench/gpu_session24_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s24a-out}
mkdir -p "$OUT" /tmp/s24a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh
T=/tmp/s24a-steps

machine
wheels fla_core einops
step "1. EXL3 GPU tests" 150 "$OUT/gpu_tests.txt" \
    python -m pytest -q -x tests/gpu/test_exl3_gpu.py tests/gpu/test_exl3_moe_gpu.py
step "2. GEMV forms, TP=2 shard, sweep" 170 "$T/gemv_forms.txt" \
    python bench/exl3_gemv_bench.py --shard 2 --sweep --budget 150 --out "$T/gemv_forms_shard2.json"
step "3. released depth decode, q4, graphs, mma" 75 "$T/released_decode_mma.txt" \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off \
    --no-prefill --exl3-gemv mma --out "$T/released45_decode_q4_mma.json"
step "4. released depth decode, q4, graphs, fma" 75 "$T/released_decode_fma.txt" \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off \
    --no-prefill --exl3-gemv fma --out "$T/released45_decode_q4_fma.json"
collect "$T" "$OUT/benches.json"
