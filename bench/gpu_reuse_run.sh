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

say "## machine ($(date -u +%FT%TZ))"
timeout 20 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
names=$(ls .wheels | sed 's/-[0-9].*//' | sort -u)
python -m pip install -q --no-deps --no-index --find-links .wheels --target /tmp/pylib $names > "$OUT/pip.log" 2>&1
say "pip exit $?"

t=$(cap "1. reuse tests" 240)
if (( t > 0 )); then
    say "## 1. tests/gpu/test_reuse_gpu.py (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_reuse_gpu.py > "$OUT/reuse_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep -E "passed|failed|Error|assert" "$OUT/reuse_gpu.txt" | tail -25 >> "$LOG"
fi

t=$(cap "2. reuse bench" 300)
if (( t > 0 )); then
    say "## 2. bench/reuse_bench.py (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/reuse_bench.py --out "$OUT/reuse_bench.json" > "$OUT/reuse_bench.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -8 "$OUT/reuse_bench.txt" >> "$LOG"
fi
say "## done after $(( $(date +%s) - START )) s"
