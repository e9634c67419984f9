#!/usr/bin/env bash
# The whole GPU suite on the lent H200 (session 11), fla-core left out, ≤ BUDGET s
#     BUDGET=560 bash bench/gpu_suite_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/suite-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh

machine
wheels fla_core einops
step "tests/gpu" 540 "$OUT/gpu_suite.txt" python -m pytest -q -p no:cacheprovider --durations=15 tests/gpu
say "## done after $(( $(date +%s) - START )) s"
