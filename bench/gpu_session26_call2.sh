#!/usr/bin/env bash
# Session 26's second call, <= BUDGET s: a step's `_hc_post` also makes the next hyper-connection's partial sums
# (two launches a sublayer where there were three) — tests/gpu but test_exl3_gpu.py (its kernels are untouched:
# call 1), then the hyper-connection bench (the chained sublayer against three launches, µs and bits) and the
# released depth's graphed q4 decode step, chained and with --hc-unchained, in turn, twice.
#     BUDGET=560 bash bench/gpu_session26_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s26b-out}
mkdir -p "$OUT" /tmp/s26b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh
T=/tmp/s26b-steps
R="--layers released --exl3-experts --shard 2"
D="--dense q4 --modes graphs --tp2 off --no-prefill"

machine
wheels fla_core einops
step "1. tests/gpu but test_exl3_gpu.py, -n 8 --dist loadfile" 280 "$OUT/gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider -n 8 --dist loadfile --durations=10 tests/gpu \
    --ignore=tests/gpu/test_exl3_gpu.py
step "2. hyper-connection bench" 90 "$T/hc_bench.txt" python bench/hc_bench.py --out "$T/hc_bench.json"
for i in 1 2; do
    step "3. decode q4, chained ($i)" 45 "$T/chained$i.txt" \
        python bench/gpu_engine.py $R $D --out "$T/decode45_q4_chained$i.json"
    step "3. decode q4, unchained ($i)" 45 "$T/unchained$i.txt" \
        python bench/gpu_engine.py $R $D --hc-unchained --out "$T/decode45_q4_unchained$i.json"
done
collect "$T" "$OUT/benches.json"
