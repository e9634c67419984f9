#!/usr/bin/env bash
# Session 25's fifth call, <= BUDGET s: fla-core's shipped choices (engine/ops/fla_configs) — the GPU test (fresh
# processes and Triton caches read them instead of autotuning; exact against the token steps at 32 and 22 heads, for
# this GPU's folder and the GB10's), then a first start timed with each folder and the shared memory a block each
# compiled kernel takes (on sm_90: the GB10 allows 101,376 bytes).
#     BUDGET=300 bash bench/gpu_session25_call5.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s25e-out}
mkdir -p "$OUT" /tmp/s25e-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s25e-steps

machine
wheels fla_core einops
fla_aside
step "1. GPU test of the shipped choices" 150 "$OUT/gpu_tests.txt" \
    $FLA python -m pytest -q tests/gpu/test_fla_configs_gpu.py
step "2. first start, the engine's default (this GPU's folder)" 60 "$T/time_h200.txt" \
    env -u FLA_CACHE_MODE -u FLA_CONFIG_DIR TRITON_CACHE_DIR=/tmp/tc-h200 $FLA \
    python bench/fla_configs.py time --heads 32 --head-dim 128 --out "$T/fla_time_h200.json"
step "3. first start, the GB10's folder forced" 60 "$T/time_gb10.txt" \
    env TRITON_CACHE_DIR=/tmp/tc-gb10 FLA_CACHE_MODE=strict FLA_CONFIG_DIR=engine/ops/fla_configs/NVIDIA_GB10 $FLA \
    python bench/fla_configs.py time --heads 32 --head-dim 128 --out "$T/fla_time_gb10.json"
collect "$T" "$OUT/benches.json"
