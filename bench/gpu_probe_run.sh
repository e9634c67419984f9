#!/usr/bin/env bash
# A short call on the lent one-GPU machine (kind nvidia-h200, `.wheels` carried with fla-core and einops), ≤ 420 s:
#     bash bench/gpu_probe_run.sh
# 1. the engine benchmark's serving path only (graph decode b1-4, per-layer cut times, a kernel profile of the b1 step;
#    no prefill, no TP=2) -> gpu_engine.json, engine.log
# 2. the CUDA parity and graph tests (the fused decode kernels against the CPU reference) -> tests_gpu.txt
# 3. bench/kda_bench.py: our KDA kernels against fla-core's -> kda_bench.json, kda.log
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/probe-out}
mkdir -p "$OUT" /tmp/pylib
export PYTHONPATH=.:tests/engine:tests/gpu:/tmp/pylib PYTHONUNBUFFERED=1
pip install -q --no-deps --no-index --target /tmp/pylib .wheels/einops-*.whl .wheels/fla_core-*.whl > "$OUT/pip.log" 2>&1
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > "$OUT/machine.txt"
timeout -s INT -k 10 170 python bench/gpu_engine.py --modes graphs --no-prefill --profile --tp2 off \
    --out "$OUT/gpu_engine.json" > "$OUT/engine.log" 2>&1
echo "engine exit $?" >> "$OUT/machine.txt"
timeout -s INT -k 10 110 python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_cuda_parity.py \
    tests/gpu/test_graphs.py > "$OUT/tests_gpu.txt" 2>&1
echo "tests exit $?" >> "$OUT/machine.txt"
timeout -s INT -k 10 200 python bench/kda_bench.py --out "$OUT/kda_bench.json" --budget 60 > "$OUT/kda.log" 2>&1
echo "kda exit $?" >> "$OUT/machine.txt"
