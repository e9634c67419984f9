#!/usr/bin/env bash
# One call on the lent one-GPU machine for structured outputs (session 7), `.wheels` carried (xgrammar and
# apache-tvm-ffi, pydantic and fastapi for engine/server's imports, jsonschema; with their dependencies), ≤ BUDGET s:
#     BUDGET=540 bash bench/gpu_structured_run.sh
#   1. tests/gpu/test_structured_gpu.py: formats through the scheduler with CUDA graphs and drafts   -> structured_gpu.txt
#   2. tests/gpu/test_drafts_gpu.py: the scheduler's masking path must not move drafted ≡ serial      -> drafts_gpu.txt
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/structured-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}
. bench/run_steps.sh

say "## machine ($(date -u +%FT%TZ))"
timeout 20 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
names=$(ls .wheels | sed 's/-[0-9].*//' | sort -u)
python -m pip install -q --no-deps --no-index --find-links .wheels --target /tmp/pylib $names > "$OUT/pip.log" 2>&1
say "pip exit $? ($(python -c 'import importlib.metadata as m, sys, xgrammar; print("xgrammar", m.version("xgrammar"), "python", sys.version.split()[0])' 2>&1 | tail -1))"

t=$(cap "1. structured tests" 240)
if (( t > 0 )); then
    say "## 1. tests/gpu/test_structured_gpu.py (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_structured_gpu.py > "$OUT/structured_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep -E "passed|failed|Error|assert" "$OUT/structured_gpu.txt" | tail -25 >> "$LOG"
fi

t=$(cap "2. drafts tests" 280)
if (( t > 0 )); then
    say "## 2. tests/gpu/test_drafts_gpu.py (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_drafts_gpu.py > "$OUT/drafts_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep -E "passed|failed|Error|assert" "$OUT/drafts_gpu.txt" | tail -25 >> "$LOG"
fi
say "## done after $(( $(date +%s) - START )) s"
