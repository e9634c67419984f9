#!/usr/bin/env bash
# One call on the lent one-GPU machine for MTP drafts (session 9), `.wheels` carried, ≤ BUDGET s:
#     BUDGET=560 bash bench/gpu_mtp_run.sh
#   1. tests/gpu: MTP drafts (graphs), the copy-draft and graph suites the lane refactor touched -> gpu_tests.txt
#   2. bench/verify_bench.py --mtp: 4-layer full width + MTP layer, MTP-drafted steps vs plain  -> verify_mtp.json
#   3. bench/verify_bench.py: the same without MTP (copy-style windows), for the side by side    -> verify.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtp-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh

machine
wheels
step "1. tests/gpu (mtp, drafts, graphs, reuse)" 300 "$OUT/gpu_tests.txt" \
    python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_mtp_gpu.py tests/gpu/test_drafts_gpu.py \
    tests/gpu/test_graphs.py tests/gpu/test_reuse_gpu.py
step "2. bench/verify_bench.py --mtp" 150 "$OUT/verify_mtp.txt" \
    python bench/verify_bench.py --mtp --out "$OUT/verify_mtp.json"
step "3. bench/verify_bench.py" 100 "$OUT/verify.txt" \
    python bench/verify_bench.py --out "$OUT/verify.json"
say "## done after $(( $(date +%s) - START )) s"
