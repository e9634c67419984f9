#!/usr/bin/env bash
# Third DENSE call (session 10), fla-core left out, ≤ BUDGET s: the 4-layer full-width bench with DENSE=bf16 (the
# same figures as run2's q4 / fp8, for the side by side), then the quality table of the modes on that config
#     BUDGET=580 bash bench/gpu_dense_run3.sh          -> engine_bf16.json, quality_full_width.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dense-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-580}
. bench/run_steps.sh

machine
wheels fla_core einops
step "engine --dense bf16" 170 "$OUT/engine_bf16.txt" \
    python bench/gpu_engine.py --dense bf16 --modes graphs --tp2 off --out "$OUT/engine_bf16.json"
step "quality, full width" 200 "$OUT/quality.txt" \
    python bench/quality_full_width.py --tokens 512 --out "$OUT/quality_full_width.json"
say "## done after $(( $(date +%s) - START )) s"
