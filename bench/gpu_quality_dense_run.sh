#!/usr/bin/env bash
# The DENSE modes' quality at GLM-5.3-Flash's widths on the lent H200 (session 11), fla-core left out, ≤ BUDGET s:
# bench/quality_full_width.py against the exact mode (bf16 weights, bf16 rows, token-by-token KDA)
#     BUDGET=330 bash bench/gpu_quality_dense_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/quality-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-330}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. dense modes at full width" 300 "$OUT/quality_dense.txt" python bench/quality_full_width.py --tokens 512 \
    --continuation 48 --mode dense=fp8 --mode dense=q4 --mode dense=q4,kv=fp8,kda=chunked --out "$OUT/quality_dense.json"
say "## done after $(( $(date +%s) - START )) s"
