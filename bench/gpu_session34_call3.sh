#!/usr/bin/env bash
# Session 34's third call (any GPU), <= BUDGET s: a decode step's fp8 index keys read as 16-bit words and decoded
# (`triton_dsa._e4m3_words`: the tensor cores' operands laid out as a bf16 pool's, kWidth 2) — the probe's step ≡
# chunk, the indexer and pool-key GPU tests, and what the step's scores cost against the tree before (e4m3 loaded and
# converted; .wheels/prev/triton_dsa.py) at 32k / 128k / 1M.
#     BUDGET=400 bash bench/gpu_session34_call3.sh
# (`_e4m3_words` is no longer in the tree: call 4 ran this script again, OUT=/tmp/s34d-out and its grep counting
# `_bf16_boundary`, with the keys converted as before behind `triton_dsa._bf16_boundary`, which gave the same bits at
# a lower cost)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s34c-out}
mkdir -p "$OUT" /tmp/s34c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-400}
. bench/run_steps.sh
T=/tmp/s34c-steps

machine
wheels fla_core einops
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r engine bench /tmp/before/
cp .wheels/prev/triton_dsa.py /tmp/before/engine/ops/triton_dsa.py
grep -c "_e4m3_words" /tmp/before/engine/ops/triton_dsa.py engine/ops/triton_dsa.py | tee -a "$LOG"
step "1. the indexer's bits, one difference at a time" 100 "$T/probe.txt" python bench/index_bits_probe.py \
    --kinds bf16,fp8 --contexts 8192,32768 --out "$T/index_bits.json"
step "2. GPU tests: rows (indexer, e4m3), pool keys" 150 "$T/tests.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_rows_gpu.py tests/gpu/test_pool_keys_gpu.py
for i in 1 2; do
    step "3. a step's pool keys and scores, this tree ($i)" 50 "$T/keys_now$i.txt" python bench/pool_keys_bench.py \
        --spans 32768,131072,1048576 --kv bf16,fp8 --out "$T/pool_keys_now$i.json"
    step "4. the same, before ($i)" 50 "$T/keys_before$i.txt" \
        env PYTHONPATH=/tmp/pylib:/tmp/before:/tmp/before/bench:tests/engine:tests/gpu:tests \
        python /tmp/before/bench/pool_keys_bench.py --spans 32768,131072,1048576 --kv bf16,fp8 \
        --out "$T/pool_keys_before$i.json"
done
collect "$T" "$OUT/benches.json"
