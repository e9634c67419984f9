#!/usr/bin/env bash
# Session 24's second call, <= BUDGET s: a verify window's KDA rows in one launch (a form of triton_kda._kda_decode
# taken out after this call: its rows after the first were not the serial decode's bits; docs/BENCHMARKS.md) —
# the GPU tests that launch every engine kernel, recording the launches for the GB10 compile test (drafted ≡ serial
# through the new kernel among them), the EXL3 decode GEMV's tensor-core form (every format and row count, each
# row's bits in any column), the MTP drafting tests, and at the released depth the step that may verify and the
# MTP-drafted windows (bf16 dense, as sessions 17 and 19), and the plain q4 decode step.
#     BUDGET=560 bash bench/gpu_session24_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s24b-out}
mkdir -p "$OUT" /tmp/s24b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh
T=/tmp/s24b-steps
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
step "1. GPU tests, launches recorded" 230 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=220 \
    bash bench/record_triton_launches.sh
step "2. EXL3 mma form tests, MTP tests" 120 "$T/gpu_tests2.txt" \
    python -m pytest -q tests/gpu/test_mtp_gpu.py tests/gpu/test_exl3_gpu.py -k "mma or column or mtp or drafted"
step "3. released depth: row invariance, verify window" 50 "$T/rows45.txt" \
    python bench/row_invariance_cost.py $R --out "$T/row_invariance_released45.json"
step "4. released depth + MTP: verify windows" 40 "$T/verify45.txt" \
    python bench/verify_bench.py $R --mtp --out "$T/verify45.json"
step "5. released depth decode, q4" 40 "$T/released_q4.txt" \
    python bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill --out "$T/released45_q4.json"
collect "$T" "$OUT/benches.json"
