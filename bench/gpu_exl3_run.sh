#!/usr/bin/env bash
# On the lent H200 machine (the lead's run: `bash bench/gpu_exl3_run.sh`): the EXL3 GPU tests, then the EXL3
# benchmark (configurations, the MoE case at GLM-5.3-Flash's shapes, windows, batches). Results under $OUT:
# exl3_tests.txt / exl3_tests.xml (pytest), exl3_bench.json (bench/exl3_bench.py). Bounded: 150 s in all.
set -u
OUT=${OUT:-/tmp/exl3-out}
mkdir -p "$OUT"
export PYTHONPATH=.:tests/engine
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-exl3}
start=$(date +%s)
timeout 80 python -m pytest -q -p no:cacheprovider tests/gpu/test_exl3_moe.py tests/gpu/test_exl3_gpu.py \
    --junitxml "$OUT/exl3_tests.xml" > "$OUT/exl3_tests.txt" 2>&1
echo "tests: exit $? after $(( $(date +%s) - start )) s"
tail -15 "$OUT/exl3_tests.txt"
left=$(( 145 - ($(date +%s) - start) ))
timeout "$left" python bench/exl3_bench.py --budget $(( left - 25 )) --out "$OUT/exl3_bench.json" 2>&1 | tail -30
echo "bench: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
