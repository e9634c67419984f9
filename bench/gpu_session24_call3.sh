#!/usr/bin/env bash
# Session 24's third call, <= BUDGET s: a verify window's KDA rows read where they are (strided views) instead of
# copied out first — the drafting GPU tests (drafted ≡ serial, rejected drafts leave no trace), then at the released
# depth the step that may verify and its window of 4 (bf16 dense, as sessions 17 and 19), this tree against the same
# tree with the copies put back (a sed of one line, in a copy under /tmp), in turn, twice.
#     BUDGET=330 bash bench/gpu_session24_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s24c-out}
mkdir -p "$OUT" /tmp/s24c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-330}
. bench/run_steps.sh
T=/tmp/s24c-steps
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
rm -rf /tmp/copies && mkdir -p /tmp/copies && cp -r engine bench /tmp/copies/
sed -i 's/row_t = (mixed\[:, t\], f\[:, t\], gate\[:, t\])  #.*/row_t = (mixed[:, t].contiguous(), f[:, t].contiguous(), gate[:, t].contiguous())/' \
    /tmp/copies/engine/models/glm5_next/kda.py
grep -c "contiguous(), f\[:, t\].contiguous()" /tmp/copies/engine/models/glm5_next/kda.py | tee -a "$LOG"
step "1. drafting GPU tests" 130 "$OUT/gpu_tests.txt" \
    python -m pytest -q tests/gpu/test_drafts_gpu.py tests/gpu/test_mtp_gpu.py
for n in 1 2; do
    step "2.$n released depth, verify window 4: strided" 45 "$T/rows45_strided_$n.txt" \
        python bench/row_invariance_cost.py $R --out "$T/rows45_strided_$n.json"
    step "3.$n released depth, verify window 4: copies" 45 "$T/rows45_copies_$n.txt" \
        env PYTHONPATH=/tmp/pylib:/tmp/copies:/tmp/copies/bench python /tmp/copies/bench/row_invariance_cost.py $R \
        --out "$T/rows45_copies_$n.json"
done
collect "$T" "$OUT/benches.json"
