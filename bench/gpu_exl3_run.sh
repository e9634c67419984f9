#!/usr/bin/env bash
# On the lent H200 machine (the lead's run: `bash bench/gpu_exl3_run.sh`): the EXL3 GPU tests, then the EXL3
# benchmark (launch configurations, the MoE case at GLM-5.3-Flash's shapes, windows, batches). Results under $OUT:
# exl3_moe_tests.txt / exl3_gpu_tests.txt (+ .xml, pytest), exl3_bench.json (bench/exl3_bench.py). Bounded: each step
# by `timeout`, 150 s in all (the bench gets what the tests leave, at least 60 s).
set -u
OUT=${OUT:-/tmp/exl3-out}
mkdir -p "$OUT"
export PYTHONPATH=.:tests/engine
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-exl3}
start=$(date +%s)
for t in moe:45 gpu:35; do
    name=${t%%:*}
    timeout "${t##*:}" python -m pytest -q -p no:cacheprovider "tests/gpu/test_exl3_$name.py" \
        --junitxml "$OUT/exl3_${name}_tests.xml" > "$OUT/exl3_${name}_tests.txt" 2>&1
    echo "tests/gpu/test_exl3_$name.py: exit $? after $(( $(date +%s) - start )) s"
    tail -6 "$OUT/exl3_${name}_tests.txt"
done
left=$(( 147 - ($(date +%s) - start) ))
timeout "$left" python bench/exl3_bench.py --budget $(( left - 20 )) --out "$OUT/exl3_bench.json" 2>&1 | tail -30
echo "bench: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
