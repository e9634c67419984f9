#!/usr/bin/env bash
# Session 22's fifth call, <= BUDGET s: the wgmma form two K tiles a step (one fence and barrier pair for both) —
# its GPU tests, the grouped-experts bench, and the released depth's prefill (q4, 8k and 32k) with the default and
# with two K tiles a step (PROMPT_LAUNCH overridden for that run alone).
# The option was removed after this call (docs/BENCHMARKS.md, session 22): step 4 measures it only at commit caa8091.
#     BUDGET=300 bash bench/gpu_session22_call5.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s22e-out}
mkdir -p "$OUT" /tmp/s22e-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s22e-steps
PRE="tests/gpu/test_exl3_moe_gpu.py::test_prompt_chunk_on_the_tensor_cores_equals_the_expert_loop"

machine
wheels fla_core einops
fla_aside
step "1. wgmma GPU tests" 80 "$OUT/gpu_tests.txt" python -m pytest -q -p no:cacheprovider \
    "$PRE[True-fp16_wgmma]" "$PRE[True-fp16_wgmma_2_k_tiles]" "$PRE[False-fp16_wgmma_2_k_tiles]" \
    tests/gpu/test_exl3_moe_gpu.py::test_the_wgmma_form_decodes_every_width_like_the_dot_form
step "2. grouped EXL3 experts bench" 80 "$T/exl3_prompt.txt" \
    python bench/exl3_prompt_bench.py --tokens 2048,8192 --tp 2,1 --budget 70 --out "$T/exl3_prompt.json"
step "3. released depth prefill, q4" 60 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
step "4. released depth prefill, q4, two K tiles a step" 60 "$T/released_prefill_q4_ku2.txt" \
    $FLA python -c "import runpy, sys; from engine.ops import triton_exl3 as t; t.PROMPT_LAUNCH['wgmma_ku'] = 2; \
sys.argv = ['bench/gpu_engine.py'] + sys.argv[1:]; runpy.run_path('bench/gpu_engine.py', run_name='__main__')" \
    --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4_ku2.json"
collect "$T" "$OUT/benches.json"
