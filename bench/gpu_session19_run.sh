#!/usr/bin/env bash
# Fewer, shorter kernels in a decode step (session 19, issue 20) on the lent H200, fla-core left out, <= BUDGET s;
# every file it keeps is under $OUT (at most 8 come back from a device call: step outputs go to /tmp):
#     BUDGET=520 bash bench/gpu_session19_run.sh
# 1. bench/record_triton_launches.sh (its GPU tests: the dense products' slices summed in-kernel, EXL3 experts routed
#    by one kernel, the SwiGLU kernel, drafted == serial) -> triton_launches.json for tests/fixtures;
# 2. bench/hc_bench.py (the hyper-connection kernels' launches); 3. bench/dense_bench.py, 20 calls a graph;
# 4-5. the released depth's decode step, q4 and bf16 (EXL3 experts, rank 0's TP=2 share); 6. the 4-layer bf16 step;
# 7. bench/decode_trace.py, 4 layers, EXL3, q4.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s19-out}
mkdir -p "$OUT" /tmp/s19-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-520}
. bench/run_steps.sh
T=/tmp/s19-steps
E="--modes graphs --tp2 off --no-prefill"
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
step "1. record Triton launches (GPU tests)" 250 "$OUT/gpu_tests.txt" env OUT="$OUT" LIMIT=235 bash bench/record_triton_launches.sh
step "2. hyper-connection launches" 40 "$T/hc.txt" python bench/hc_bench.py --out "$T/hc_bench.json"
step "3. dense products, 20 calls a graph" 70 "$T/dense20.txt" \
    python bench/dense_bench.py --tp 1,2 --calls 20 --out "$T/dense_products_calls20.json"
for d in q4 bf16; do
    step "4-5. released depth decode, $d" 60 "$T/released_$d.txt" \
        python bench/gpu_engine.py $R --dense $d $E --out "$T/released45_$d.json"
done
step "6. 4 layers decode, bf16" 40 "$T/kkkd_bf16.txt" python bench/gpu_engine.py --dense bf16 $E --out "$T/kkkd_bf16.json"
step "7. decode trace, 4 layers, EXL3, q4" 60 "$T/trace.txt" \
    python bench/decode_trace.py --layers KKKD --exl3-experts --shard 2 --dense q4 --out "$OUT/trace_kkkd_exl3_q4.json.gz"
collect "$T" "$OUT/benches.json"
