#!/usr/bin/env bash
# One call on the lent one-GPU machine after a refactor of the serving path (session 5: EngineConfig, engine/runner/,
# ops/fused.py), ≤ BUDGET s, without fla-core (KDA prompts take the torch chunked form; the fla tests skip):
#     BUDGET=500 bash bench/gpu_check_run.sh
#   1. tests/gpu: CUDA parity, CUDA graphs (through the runner's LaneDecoder and StepExecutor), EXL3 kernels and
#      the EXL3 MoE served on CUDA                                               -> tests_gpu.txt
# (A serve through the API is not among the steps: the machine has no uvicorn/fastapi and no network.)
#   2. bench/gpu_engine.py: graph decode b1-4, no prefill (the figures the runner move must keep)  -> gpu_engine.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/check-out}
mkdir -p "$OUT"
export PYTHONPATH=.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-500}
. bench/run_steps.sh

say "## machine ($(date -u +%FT%TZ))"
timeout 20 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"

t=$(cap "1. tests" 300)
if (( t > 0 )); then
    say "## 1. tests/gpu (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -p no:cacheprovider tests/gpu > "$OUT/tests_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -15 "$OUT/tests_gpu.txt" >> "$LOG"
fi

t=$(cap "2. gpu_engine" 150)
if (( t > 0 )); then
    say "## 2. gpu_engine (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/gpu_engine.py --modes graphs --no-prefill --tp2 off \
        --out "$OUT/gpu_engine.json" > /tmp/gpu_engine.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep -v '^ ' /tmp/gpu_engine.log | grep -v '^[{}]' | tail -25 >> "$LOG"
fi
say "## done after $(( $(date +%s) - START )) s"
