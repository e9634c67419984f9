#!/usr/bin/env bash
# What the row-invariant step costs on the lent H200 and where (session 17, issue 18), fla-core left out (decode
# steps do not use it; no first-start autotune), <= BUDGET s:
#     BUDGET=560 bash bench/gpu_row_invariance_run.sh
# 1. tests/gpu/test_prompt_forms_gpu.py (the 64/65-row gate; the hyper-connection kernels past 2^31 values);
# 2. bench/row_invariance_cost.py at the released depth (45 layers, random 4-bit EXL3 experts, rank 0's TP=2 share):
#    off / window / each kind padded alone / on / on with copy-padding, and the b1 step's kernels off and on;
# 3. the same at 4 layers (KKKD) bf16 TP=1, as far as the budget goes.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/row-invariance-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. tests/gpu/test_prompt_forms_gpu.py" 120 "$OUT/prompt_forms_gpu.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_prompt_forms_gpu.py
step "2. released depth, EXL3 experts, TP=2 shard: row-invariance cost by kind, profiles" 300 "$OUT/released45.txt" \
    python bench/row_invariance_cost.py --layers released --exl3-experts --shard 2 --kinds --profile \
    --out "$OUT/released45.json"
step "3. 4 layers (KKKD), bf16, TP=1: row-invariance cost by kind" 200 "$OUT/kkkd.txt" \
    python bench/row_invariance_cost.py --layers KKKD --kinds --out "$OUT/kkkd.json"
say "## done after $(( $(date +%s) - START )) s"
