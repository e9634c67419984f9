#!/usr/bin/env bash
# One call on the lent 2-GPU machine (kind nvidia-h200-x2, `.wheels` carried with fla-core and einops), ≤ BUDGET s:
#     BUDGET=540 bash bench/gpu_prompt_run.sh
# Steps, most important first, each bounded by its own cap and by what is left of BUDGET:
#   1. tests/gpu/tp2_repeat.py: the TP=2 NCCL worker twice (it hung in destroy_process_group before
#      parallel.exit_process)                                                  -> tp2_repeat.txt
#   2. the TP=2 GPU tests: NCCL TP=2 = TP=1 (bf16 and EXL3), graphs over NCCL  -> tests_gpu.txt
#   3. bench/gpu_engine.py --prefill-breakdown: where a 2k prompt chunk's time goes at 2k and 32k (the first
#      load autotunes fla-core's kernels, ~160 s)                              -> gpu_engine_breakdown.json
# run.log has the machine, each step's exit and time. Everything else goes to /tmp.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/prompt-out}
mkdir -p "$OUT" /tmp/pylib
export PYTHONPATH=.:tests/engine:tests/gpu:tests:/tmp/pylib PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUDGET=${BUDGET:-540}
. bench/run_steps.sh

say "## machine ($(date -u +%FT%TZ))"
timeout 20 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
pip install -q --no-deps --no-index --target /tmp/pylib .wheels/einops-*.whl .wheels/fla_core-*.whl >/dev/null 2>&1

t=$(cap "1. tp2_repeat" 100)
if (( t > 0 )); then
    say "## 1. tp2_repeat (timeout $t s)"
    timeout -s INT -k 10 "$t" python tests/gpu/tp2_repeat.py --runs 2 --timeout 45 > "$OUT/tp2_repeat.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep "^run " "$OUT/tp2_repeat.txt" >> "$LOG"
fi

t=$(cap "2. TP=2 tests" 200)
if (( t > 0 )); then
    say "## 2. TP=2 tests (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_cuda_parity.py \
        tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_graphs_tp.py -k "tp2 or graphs_tp" > "$OUT/tests_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -6 "$OUT/tests_gpu.txt" >> "$LOG"
fi

t=$(cap "3. prefill breakdown" 260)
if (( t > 0 )); then
    say "## 3. prefill breakdown (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/gpu_engine.py --modes none --no-prefill --tp2 off \
        --prefill-breakdown 2048,32768 --out "$OUT/gpu_engine_breakdown.json" > /tmp/gpu_engine.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep "prefill chunk" /tmp/gpu_engine.log >> "$LOG"
fi
say "## done after $(( $(date +%s) - START )) s"
