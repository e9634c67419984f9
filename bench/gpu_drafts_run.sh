#!/usr/bin/env bash
# One call on the lent one-GPU machine for exact drafting (session 6), ≤ BUDGET s:
#     BUDGET=540 bash bench/gpu_drafts_run.sh
#   1. tests/gpu/test_drafts_gpu.py: row invariance and rejected drafts on CUDA, eager and graphs -> drafts_gpu.txt
#   2. tests/gpu (the rest): parity, graphs, EXL3 — the verify path must not move them                -> tests_gpu.txt
#   3. bench/verify_bench.py: verify windows 2..5 against the plain step, batch 1 and 4                -> verify.json
#   4. bench/row_invariance_cost.py: decode / verify with and without row-invariant products, and the bits -> row_invariance.json
#   5. bench/gpu_engine.py: graph decode b1-4 without drafts (must not have moved)                     -> gpu_engine.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/drafts-out}
mkdir -p "$OUT"
export PYTHONPATH=.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}
. bench/run_steps.sh

say "## machine ($(date -u +%FT%TZ))"
timeout 20 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"

t=$(cap "1. drafts tests" 200)
if (( t > 0 )); then
    say "## 1. tests/gpu/test_drafts_gpu.py (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_drafts_gpu.py > "$OUT/drafts_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep -E "passed|failed|Error|assert" "$OUT/drafts_gpu.txt" | tail -25 >> "$LOG"
fi

t=$(cap "2. tests" 200)
if (( t > 0 )); then
    say "## 2. tests/gpu (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -p no:cacheprovider tests/gpu --ignore=tests/gpu/test_drafts_gpu.py > "$OUT/tests_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -15 "$OUT/tests_gpu.txt" >> "$LOG"
fi

t=$(cap "3. verify bench" 90)
if (( t > 0 )); then
    say "## 3. verify_bench (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/verify_bench.py --out "$OUT/verify.json" > /tmp/verify.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -8 /tmp/verify.log >> "$LOG"
fi

t=$(cap "4. row invariance" 90)
if (( t > 0 )); then
    say "## 4. row_invariance_cost (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/row_invariance_cost.py --out "$OUT/row_invariance.json" > /tmp/ri.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -4 /tmp/ri.log >> "$LOG"
fi

t=$(cap "5. gpu_engine" 100)
if (( t > 0 )); then
    say "## 5. gpu_engine (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/gpu_engine.py --modes graphs --no-prefill --tp2 off \
        --out "$OUT/gpu_engine.json" > /tmp/gpu_engine.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep -v '^ ' /tmp/gpu_engine.log | grep -v '^[{}]' | tail -12 >> "$LOG"
fi
say "## done after $(( $(date +%s) - START )) s"
