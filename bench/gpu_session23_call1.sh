#!/usr/bin/env bash
# Session 23's first call, <= BUDGET s: DSA's indexer in one launch (triton_dsa.index_scores) and no host reads in
# DSA's prompt path — the GPU tests that launch every engine kernel (recording the launches for the GB10 compile
# test), the indexer bench (torch form against the kernel's launches), the 4-layer prompt chunk's trace (now with its
# wall time and the GPU's idle time), the released depth's prefill (q4, 8k and 32k) and graphed decode, and the
# released depth's prompt-chunk trace.
#     BUDGET=540 bash bench/gpu_session23_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s23a-out}
mkdir -p "$OUT" /tmp/s23a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}
. bench/run_steps.sh
T=/tmp/s23a-steps

machine
wheels fla_core einops
fla_aside
step "1. GPU tests, launches recorded" 230 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=220 \
    bash bench/record_triton_launches.sh
step "2. indexer bench" 45 "$T/dsa_index.txt" \
    python bench/dsa_prompt_bench.py --index --contexts 8192,32768 --out "$T/dsa_index.json"
step "3. prefill trace, 4 layers, EXL3, q4, 8k" 45 "$T/prefill_trace.txt" \
    $FLA python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --prefill 8192 \
    --out /tmp/trace_prefill_kkkd_exl3_q4.json.gz
step "4. released depth prefill, q4" 65 "$T/released_prefill_q4.txt" \
    $FLA python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/released45_prefill_q4.json"
step "5. released depth decode, q4, graphs" 70 "$T/released_decode_q4.txt" \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off \
    --no-prefill --out "$T/released45_decode_q4.json"
step "6. prefill trace, released depth, 8k" 90 "$T/prefill_trace_released.txt" \
    $FLA python bench/decode_trace.py --layers released --exl3-experts --shard 2 --dense q4 --prefill 8192 \
    --out "$OUT/trace_prefill_released_q4.json.gz"
cp /tmp/trace_prefill_kkkd_exl3_q4.json.gz "$OUT/" 2>/dev/null
collect "$T" "$OUT/benches.json"
