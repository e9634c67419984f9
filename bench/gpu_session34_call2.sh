#!/usr/bin/env bash
# Session 34's call for any GPU (H100 or H200), <= BUDGET s: why a decode step's fp8 indexer scores differ in their last
# bits from a prompt chunk's (tests/gpu/test_rows_gpu.py's fp8 case; bench/index_bits_probe.py changes one difference
# at a time), then the indexer tests and the chunk's indexer time with `_index_scores` compiled without FMA
# contraction (a copy of the tree whose INDEX_FP_FUSION is False) beside this tree's.
#     BUDGET=400 bash bench/gpu_session34_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s34b-out}
mkdir -p "$OUT" /tmp/s34b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-400}
. bench/run_steps.sh
T=/tmp/s34b-steps

machine
wheels fla_core einops
rm -rf /tmp/nofma && mkdir -p /tmp/nofma && cp -r engine bench tests /tmp/nofma/
sed -i 's|^INDEX_FP_FUSION = True|INDEX_FP_FUSION = False|' /tmp/nofma/engine/ops/triton_dsa.py
grep -c "^INDEX_FP_FUSION = False" /tmp/nofma/engine/ops/triton_dsa.py | tee -a "$LOG"
NOFMA="env PYTHONPATH=/tmp/pylib:/tmp/nofma:/tmp/nofma/bench:/tmp/nofma/tests/engine:/tmp/nofma/tests"
step "1. the indexer's bits, one difference at a time" 120 "$T/probe.txt" python bench/index_bits_probe.py \
    --kinds bf16,fp8 --contexts 8192,32768 --out "$T/index_bits.json"
step "2. the indexer tests, this tree" 90 "$T/tests_now.txt" python -m pytest -q -x -p no:cacheprovider \
    tests/gpu/test_rows_gpu.py -k "indexer or e4m3"
step "3. the indexer tests, no FMA contraction" 90 "$T/tests_nofma.txt" $NOFMA python -m pytest -q -p no:cacheprovider \
    /tmp/nofma/tests/gpu/test_rows_gpu.py -k "indexer or e4m3"
step "4. a chunk's indexer, this tree" 60 "$T/time_now.txt" python bench/dsa_prompt_bench.py --index --keys bf16,fp8 \
    --contexts 32768,131072 --out "$T/index_now.json"
step "5. a chunk's indexer, no FMA contraction" 60 "$T/time_nofma.txt" $NOFMA python /tmp/nofma/bench/dsa_prompt_bench.py \
    --index --keys bf16,fp8 --contexts 32768,131072 --out "$T/index_nofma.json"
collect "$T" "$OUT/benches.json"
