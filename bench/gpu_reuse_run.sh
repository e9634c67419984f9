#!/usr/bin/env bash
# One call on the lent one-GPU machine for prompt reuse (session 8), `.wheels` carried (fla-core, einops, the
# server's imports), ≤ BUDGET s:
#     BUDGET=560 bash bench/gpu_reuse_run.sh
#   1. tests/gpu/test_reuse_gpu.py: resumed ≡ cold with CUDA graphs, drafts, pool pressure       -> reuse_gpu.txt
#   2. bench/reuse_bench.py: 4-layer full-width, TTFT cold vs resent (8k, 32k), shared 8k system -> reuse_bench.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/reuse-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh

machine
wheels
step "1. tests/gpu/test_reuse_gpu.py" 240 "$OUT/reuse_gpu.txt" \
    python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_reuse_gpu.py
step "2. bench/reuse_bench.py" 300 "$OUT/reuse_bench.txt" \
    python bench/reuse_bench.py --out "$OUT/reuse_bench.json"
say "## done after $(( $(date +%s) - START )) s"
