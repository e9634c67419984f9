#!/usr/bin/env bash
# Session 22's fourth call, <= BUDGET s, the committed defaults (the wgmma form, output blocks first, four rows a
# rotation program): the prompt-path GPU tests, the grouped-experts bench at TP=2's shard, the 4-layer prompt-chunk
# trace, the released depth's prefill (q4, 8k and 32k) and its graphed decode (q4, b1 / b4: the rotation kernel is
# on the decode path too).
#     BUDGET=330 bash bench/gpu_session22_call4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s22d-out}
mkdir -p "$OUT" /tmp/s22d-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-330}
. bench/run_steps.sh
T=/tmp/s22d-steps

machine
wheels fla_core einops
fla_aside
step "1. prompt-path GPU tests" 110 "$OUT/gpu_tests.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_prompt_forms_gpu.py tests/gpu/test_moe_prompt_gpu.py tests/gpu/test_kda_prompt_gpu.py \
    "tests/gpu/test_exl3_moe_gpu.py::test_prompt_chunk_on_the_tensor_cores_equals_the_expert_loop[True-fp16_wgmma]" \
    "tests/gpu/test_exl3_moe_gpu.py::test_prompt_chunk_on_the_tensor_cores_equals_the_expert_loop[True-fp16_dot]" \
    tests/gpu/test_exl3_moe_gpu.py::test_the_wgmma_form_decodes_every_width_like_the_dot_form \
    tests/gpu/test_exl3_moe_gpu.py::test_exl3_experts_on_cuda_give_the_dense_and_cpu_tokens
step "2. released depth prefill, q4" 60 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
step "3. prefill trace, 4 layers, EXL3, q4, 8k" 40 "$T/prefill_trace.txt" \
    $FLA python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --prefill 8192 \
    --out /tmp/trace_prefill_kkkd_exl3_q4.json.gz
step "4. grouped EXL3 experts bench, TP=2" 50 "$T/exl3_prompt.txt" \
    python bench/exl3_prompt_bench.py --tokens 2048,8192 --tp 2 --budget 40 --out "$T/exl3_prompt.json"
step "5. released depth decode, q4, graphs" 70 "$T/released_decode_q4.txt" \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off \
    --no-prefill --out "$T/released45_decode_q4.json"
collect "$T" "$OUT/benches.json"
