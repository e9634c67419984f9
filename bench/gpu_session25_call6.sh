#!/usr/bin/env bash
# Session 25's sixth call, <= BUDGET s: the GB10's folder with the KDA recompute kernel capped at 2 stages (call 5:
# its recorded 4 compiled to 163,840 bytes of shared memory a block, over a GB10's 101,376) — the GPU test (fresh
# processes and Triton caches read the shipped choices instead of autotuning, exact against the token steps, the
# GB10's kernels within its shared memory as compiled here), then its first start timed with the bytes each takes.
#     BUDGET=200 bash bench/gpu_session25_call6.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s25f-out}
mkdir -p "$OUT" /tmp/s25f-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-200}
. bench/run_steps.sh
T=/tmp/s25f-steps

machine
wheels fla_core einops
fla_aside
step "1. GPU test of the shipped choices" 150 "$OUT/gpu_tests.txt" \
    $FLA python -m pytest -q tests/gpu/test_fla_configs_gpu.py
step "2. first start, the GB10's folder forced" 60 "$T/time_gb10.txt" \
    env TRITON_CACHE_DIR=/tmp/tc-gb10 FLA_CACHE_MODE=strict FLA_CONFIG_DIR=engine/ops/fla_configs/NVIDIA_GB10 $FLA \
    python bench/fla_configs.py time --heads 32 --head-dim 128 --out "$T/fla_time_gb10.json"
collect "$T" "$OUT/benches.json"
