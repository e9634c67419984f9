#!/usr/bin/env bash
# The row-invariant step without padding on the lent H200 (session 17, issue 18), fla-core left out, <= BUDGET s;
# every file it keeps is under $OUT (at most 8 come back from a device call: step outputs go to /tmp):
#     BUDGET=560 bash bench/gpu_rows_run.sh
# 1. bench/record_triton_launches.sh (its GPU tests: drafted == serial and row invariance with engine/ops/triton_rows.py
#    in the step, tests/gpu/test_rows_gpu.py) -> triton_launches.json for tests/fixtures;
# 2. tests/gpu/test_mtp_gpu.py (MTP-drafted == serial);
# 3. bench/row_invariance_cost.py at the released depth with profiles, 4. at 4 layers;
# 5. bench/verify_bench.py at the released depth with MTP drafts.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rows-out}
mkdir -p "$OUT" /tmp/rows-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh
T=/tmp/rows-steps

machine
wheels fla_core einops
step "1. record Triton launches (GPU tests)" 240 "$T/record.txt" env OUT="$OUT" LIMIT=220 bash bench/record_triton_launches.sh
step "2. tests/gpu/test_mtp_gpu.py" 90 "$T/mtp_gpu.txt" python -m pytest -q -p no:cacheprovider tests/gpu/test_mtp_gpu.py
step "3. released depth: row-invariance cost, profiles" 120 "$T/released45.txt" \
    python bench/row_invariance_cost.py --layers released --exl3-experts --shard 2 --profile --out "$OUT/released45.json"
step "4. 4 layers (KKKD): row-invariance cost" 60 "$T/kkkd.txt" \
    python bench/row_invariance_cost.py --layers KKKD --out "$OUT/kkkd.json"
step "5. released depth + MTP: verify windows" 90 "$T/verify45.txt" \
    python bench/verify_bench.py --layers released --exl3-experts --shard 2 --mtp --out "$OUT/verify45.json"
say "## done after $(( $(date +%s) - START )) s"
