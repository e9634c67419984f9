#!/usr/bin/env bash
# Session 23's second call, <= BUDGET s: the indexer with the pools as the product's tall side on Hopper (wgmma) —
# the GPU tests that launch it (recorded: merged into tests/fixtures/triton_launches.json for the kernels they
# compile), the indexer bench, the released depth's prefill in 2,048-, 4,096- and 8,192-token chunks, and the 4-layer
# bf16 bench at TP=1 with transformers warm in the same process (issue 20's ratio).
#     BUDGET=480 bash bench/gpu_session23_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s23b-out}
mkdir -p "$OUT" /tmp/s23b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
. bench/run_steps.sh
T=/tmp/s23b-steps

machine
wheels fla_core einops
fla_aside
step "1. indexer GPU tests, launches recorded" 90 "$OUT/gpu_tests.txt" env SPARKS_RECORD_TRITON="$OUT/triton_launches.json" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_rows_gpu.py tests/gpu/test_prompt_forms_gpu.py
step "2. indexer bench" 40 "$T/dsa_index.txt" \
    python bench/dsa_prompt_bench.py --index --contexts 8192,32768 --out "$T/dsa_index.json"
for chunk in 2048 4096 8192; do
    step "3. released depth prefill, q4, chunk $chunk" 50 "$T/released_prefill_q4_c$chunk.txt" \
        $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
        --prefill-lengths 8192,32768 --prefill-repeats 1 --prefill-chunk $chunk \
        --out "$T/released45_prefill_q4_c$chunk.json"
done
step "4. 4 layers bf16 TP=1, transformers warm" 200 "$T/kkkd_bf16.txt" \
    $FLA python bench/gpu_engine.py --layers KKKD --modes none --tp2 off --transformers --out "$T/kkkd_bf16.json"
collect "$T" "$OUT/benches.json"
