#!/usr/bin/env bash
# One call on the lent one-GPU machine (kind nvidia-h200, `.wheels` carried with fla-core and einops), ≤ BUDGET s:
#     BUDGET=560 bash bench/gpu_decode_run.sh
# Steps, most important first, each bounded by its own cap and by what is left of BUDGET:
#   1. bench/kda_prompt_bench.py (fla-core's chunk_kda at full width: first call with its autotune, accuracy
#      against token steps, speed against the torch chunked form)              -> kda_prompt.json
#   2. tests/gpu: KDA prompts, graphs, CUDA parity                              -> tests_gpu.txt
#   3. bench/gpu_engine.py: graph decode b1-4 with a kernel profile, the b1 step after 8k and 32k prompts,
#      prefill 2k/8k/32k (3 runs each)                                         -> gpu_engine.json
# run.log has the machine, each step's exit and time. Everything else goes to /tmp.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/decode-out}
mkdir -p "$OUT" /tmp/pylib
export PYTHONPATH=.:tests/engine:tests/gpu:tests:/tmp/pylib PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh

say "## machine ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
timeout 20 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
pip install -q --no-deps --no-index --target /tmp/pylib .wheels/einops-*.whl .wheels/fla_core-*.whl >/dev/null 2>&1

t=$(cap "1. kda_prompt_bench" 200)
if (( t > 0 )); then
    say "## 1. kda_prompt_bench (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/kda_prompt_bench.py --torch-chunked --out "$OUT/kda_prompt.json" \
        > /tmp/kda_prompt.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -4 /tmp/kda_prompt.log >> "$LOG"
fi

t=$(cap "2. tests" 200)
if (( t > 0 )); then
    say "## 2. tests (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -s -p no:cacheprovider tests/gpu/test_kda_prompt_gpu.py \
        tests/gpu/test_graphs.py tests/gpu/test_cuda_parity.py > "$OUT/tests_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -8 "$OUT/tests_gpu.txt" >> "$LOG"
fi

t=$(cap "3. gpu_engine" 240)
if (( t > 0 )); then
    say "## 3. gpu_engine (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/gpu_engine.py --modes graphs --profile --tp2 off \
        --long-contexts 8192,32768 --out "$OUT/gpu_engine.json" > /tmp/gpu_engine.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep -v '^ ' /tmp/gpu_engine.log | grep -v '^[{}]' | tail -40 >> "$LOG"
fi

say "## done after $(( $(date +%s) - START )) s"
