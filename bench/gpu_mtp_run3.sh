#!/usr/bin/env bash
# Third call (session 9), fla-core installed as served, ≤ BUDGET s:
#     BUDGET=560 bash bench/gpu_mtp_run3.sh
#   1. tests/gpu: the grouped-GEMM prompt MoE test (threshold mended), the whole verify suite (full width and EXL3
#      included: the lane decoder's capture code changed)                                      -> gpu_tests.txt
#   2. bench/gpu_engine.py --modes none: prefill 2k/8k/32k with fla-core, grouped GEMM then the loop -> prefill_*.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtp-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh

machine
wheels
step "1. tests/gpu" 240 "$OUT/gpu_tests.txt" \
    python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_moe_prompt_gpu.py tests/gpu/test_drafts_gpu.py
step "2a. prefill with fla-core, grouped GEMM" 200 "$OUT/prefill_grouped.txt" \
    python bench/gpu_engine.py --modes none --out "$OUT/prefill_grouped.json"
step "2b. prefill with fla-core, loop over experts" 100 "$OUT/prefill_loop.txt" \
    python bench/gpu_engine.py --modes none --moe-loop --out "$OUT/prefill_loop.json"
say "## done after $(( $(date +%s) - START )) s"
