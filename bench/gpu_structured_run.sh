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

machine
wheels
say "xgrammar: $(python -c 'import importlib.metadata as m, sys, xgrammar; print(m.version("xgrammar"), "python", sys.version.split()[0])' 2>&1 | tail -1)"
step "1. tests/gpu/test_structured_gpu.py" 240 "$OUT/structured_gpu.txt" \
    python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_structured_gpu.py
step "2. tests/gpu/test_drafts_gpu.py" 280 "$OUT/drafts_gpu.txt" \
    python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_drafts_gpu.py
say "## done after $(( $(date +%s) - START )) s"
