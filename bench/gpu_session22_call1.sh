#!/usr/bin/env bash
# Session 22's first call, <= BUDGET s: the EXL3 prompt experts on Hopper's warpgroup MMA (`_exl3_grouped_wgmma`,
# W_q decoded straight into the register operand) — its GPU tests against the expert loop and the dot form, the
# prompt conv's test left unrun in session 21, the grouped-experts bench with the launch variants, the 4-layer
# prompt-chunk trace and the released depth's prefill (q4, 8k and 32k).
#     BUDGET=500 bash bench/gpu_session22_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s22a-out}
mkdir -p "$OUT" /tmp/s22a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-500}
. bench/run_steps.sh
T=/tmp/s22a-steps

machine
wheels fla_core einops
fla_aside
step "1. EXL3 prompt-expert GPU tests, the conv test" 150 "$OUT/gpu_tests.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_exl3_moe_gpu.py "tests/gpu/test_prompt_forms_gpu.py::test_causal_conv_matches_cudnn_in_fp32"
step "2. grouped EXL3 experts bench" 190 "$T/exl3_prompt.txt" \
    python bench/exl3_prompt_bench.py --tokens 2048,8192 --tp 2,1 --budget 170 --out "$T/exl3_prompt.json"
step "3. prefill trace, 4 layers, EXL3, q4, 8k" 45 "$T/prefill_trace.txt" \
    $FLA python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --prefill 8192 \
    --out "$OUT/trace_prefill_kkkd_exl3_q4.json.gz"
step "4. released depth prefill, q4" 90 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
collect "$T" "$OUT/benches.json"
