#!/usr/bin/env bash
# Session 27's fourth call, <= BUDGET s (issue 19): the dense launch table from calls 2-3 (fp8 LM heads split to
# HEAD_PROGRAMS programs and compiled for any row count; two warps from 12,288 outputs) — tests/gpu/test_dense_gpu.py,
# the products' table (20 calls a graph, TP=1 and TP=2 shapes, every mode), then the released depth's graphed q4
# decode step (EXL3 experts, rank 0's TP=2 share) with this table and with the table before (a copy of the tree with
# the three constants set back), in turn, twice.
#     BUDGET=420 bash bench/gpu_session27_call4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s27d-out}
mkdir -p "$OUT" /tmp/s27d-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-420}
. bench/run_steps.sh
T=/tmp/s27d-steps
R="--layers released --exl3-experts --shard 2"
D="--dense q4 --modes graphs --tp2 off --no-prefill"

machine
wheels fla_core einops
BEFORE=/tmp/s27d-before
mkdir -p $BEFORE && cp -r engine bench $BEFORE/
sed -i -e 's/^HEAD, HEAD_PROGRAMS = 32768, 2048$/HEAD, HEAD_PROGRAMS = 32768, 528/' \
    -e 's/^BLOCK_O, TALL, PROGRAMS, MAX_SPLITS, KW, UNROLL_BELOW = 128, 12288, 528/BLOCK_O, TALL, PROGRAMS, MAX_SPLITS, KW, UNROLL_BELOW = 128, 16384, 528/' \
    -e 's/one_row=not head)$/one_row=True)/' $BEFORE/engine/ops/triton_dense.py
say "before table: $(diff engine/ops/triton_dense.py $BEFORE/engine/ops/triton_dense.py | grep -c '^>') lines changed"
step "1. tests/gpu/test_dense_gpu.py" 110 "$OUT/dense_gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_dense_gpu.py
step "2. dense products, 20 calls a graph" 100 "$T/dense20.txt" \
    python bench/dense_bench.py --tp 1,2 --calls 20 --out "$T/dense_products_calls20.json"
for i in 1 2; do
    step "3. decode q4, table now ($i)" 45 "$T/now$i.txt" python bench/gpu_engine.py $R $D --out "$T/decode45_q4_now$i.json"
    step "3. decode q4, table before ($i)" 45 "$T/before$i.txt" \
        env PYTHONPATH=/tmp/pylib:$BEFORE:$BEFORE/bench python $BEFORE/bench/gpu_engine.py $R $D \
        --out "$T/decode45_q4_before$i.json"
done
collect "$T" "$OUT/benches.json"
