#!/usr/bin/env bash
# One call on the lent 2-GPU machine (kind nvidia-h200-x2, `.wheels` carried with fla-core and einops), ≤ BUDGET s:
#     BUDGET=560 bash bench/gpu_prompt_run.sh
# Steps, most important first, each bounded by its own cap and by what is left of BUDGET:
#   1. tests/gpu/tp2_repeat.py: the TP=2 NCCL worker 4 times (the intermittent hang; stacks of a stuck rank)
#                                                                              -> tp2_repeat.txt
#   2. the KDA prompt tests (fla-core against token steps, greedy = CPU), the EXL3 TP=2 test, CUDA parity
#                                                                              -> tests_gpu.txt
#   3. bench/kda_prompt_bench.py under TRITON_F32_DEFAULT tf32x3 (the engine's), ieee and tf32
#                                                                              -> kda_prompt_<precision>.json
#   4. bench/gpu_engine.py prefill 2k/8k/32k with fla-core (no decode modes)   -> gpu_engine_prefill.json
# run.log has the machine, each step's exit and time. Everything else goes to /tmp.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/prompt-out}
mkdir -p "$OUT" /tmp/pylib
export PYTHONPATH=.:tests/engine:tests/gpu:tests:/tmp/pylib PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUDGET=${BUDGET:-560}
START=$(date +%s)
LOG="$OUT/run.log"
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
say() { echo "$*" | tee -a "$LOG"; }
cap() {
    local want=$2 rest; rest=$(left)
    if (( rest < 15 )); then echo "## $1: skipped, ${rest} s left of ${BUDGET}" | tee -a "$LOG" >&2; echo 0; return; fi
    (( want < rest )) && echo "$want" || echo "$rest"
}

say "## machine ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
timeout 20 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
pip install -q --no-deps --no-index --target /tmp/pylib .wheels/einops-*.whl .wheels/fla_core-*.whl >/dev/null 2>&1
python -c "import fla, torch, triton; print('fla', fla.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" \
    2>&1 | tee -a "$LOG"

t=$(cap "1. tp2_repeat" 150)
if (( t > 0 )); then
    say "## 1. tp2_repeat (timeout $t s)"
    timeout -s INT -k 10 "$t" python tests/gpu/tp2_repeat.py --runs 4 --timeout 60 > "$OUT/tp2_repeat.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep "^run " "$OUT/tp2_repeat.txt" >> "$LOG"
fi

t=$(cap "2. tests" 170)
if (( t > 0 )); then
    say "## 2. tests (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -s -p no:cacheprovider tests/gpu/test_kda_prompt_gpu.py \
        "tests/gpu/test_exl3_moe_gpu.py" -k "kda or tp2 or TP2 or chunk" > "$OUT/tests_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -8 "$OUT/tests_gpu.txt" >> "$LOG"
fi

for precision in tf32x3 ieee tf32; do
    t=$(cap "3. kda_prompt_bench $precision" 80)
    (( t > 0 )) || continue
    say "## 3. kda_prompt_bench $precision (timeout $t s)"
    TRITON_F32_DEFAULT=$precision timeout -s INT -k 10 "$t" python bench/kda_prompt_bench.py \
        --out "$OUT/kda_prompt_$precision.json" $([ $precision = tf32x3 ] && echo --torch-chunked) \
        > "/tmp/kda_prompt_$precision.log" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; tail -3 "/tmp/kda_prompt_$precision.log" >> "$LOG"
done

t=$(cap "4. gpu_engine prefill" 120)
if (( t > 0 )); then
    say "## 4. gpu_engine prefill (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/gpu_engine.py --out "$OUT/gpu_engine_prefill.json" --tp2 off --modes none \
        > /tmp/gpu_engine.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"; grep -v '^ ' /tmp/gpu_engine.log | grep -v '^[{}]' | tail -20 >> "$LOG"
fi
say "## done after $(( $(date +%s) - START )) s"
