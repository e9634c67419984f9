#!/usr/bin/env bash
# Session 20's fourth call, <= BUDGET s: a prompt chunk's hyper-connection forms (bench/hc_bench.py --prompt), the
# GPU tests of the hyper-connection kernels, then the released depth's prefill (q4, 8k and 32k).
#     BUDGET=130 bash bench/gpu_session20_call4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s20d-out}
mkdir -p "$OUT" /tmp/s20d-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-130}
. bench/run_steps.sh
T=/tmp/s20d-steps

machine
wheels fla_core einops
fla_aside
step "1. hc_bench --prompt" 30 "$T/hc_prompt.txt" python bench/hc_bench.py --prompt --out "$T/hc_prompt.json"
step "2. hyper-connection GPU tests" 40 "$T/hc_tests.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_rows_gpu.py -k hyper tests/gpu/test_prompt_forms_gpu.py
step "3. released depth prefill, q4" 60 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
collect "$T" "$OUT/benches.json"
