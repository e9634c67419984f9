#!/usr/bin/env bash
# The lead's single final call on the lent 2-GPU machine (kind nvidia-h200-x2, `.wheels` carried), ≤ BUDGET s:
#     bash bench/gpu_final_run.sh
# Steps, most important first, each bounded by `timeout` and by what is left of the whole run's budget (a step that
# would get under 15 s is skipped and says so). Python steps get SIGINT at their limit, so pytest still prints what
# passed and the benchmark's JSON keeps what it measured (it is rewritten after every figure):
#   1. GPU, driver and versions                                   -> run.log
#   2. tests/gpu in full, one pytest call (graphs, TP=2 graphs over NCCL, CUDA parity, EXL3)  -> tests_gpu.txt
#   3. bench/gpu_engine.py: decode graphs/eager b1-4, a kernel profile of the b1 step, per-layer times projected to
#      45 layers at TP=1 and (measured on both GPUs) TP=2, prefill 2k/8k/32k  -> gpu_engine.json, its log in run.log
#   3b. bench/kda_bench.py: our KDA kernels against fla-core's (wheels in .wheels) -> kda_bench.json
#   4. bench/exl3_bench.py (EXL3 kernel and MoE against bf16; the EXL3 tests are in step 2) -> exl3_bench.json
#   5. bench/gpu_serve_smoke.sh: TP=2 serving over NCCL through the API (needs .wheels) -> serve.log
# Files under $OUT (6, one folder): run.log, tests_gpu.txt, gpu_engine.json, kda_bench.json, exl3_bench.json,
# serve.log. Everything else goes to /tmp.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/final-out}
mkdir -p "$OUT"
export PYTHONPATH=.:tests/engine:tests/gpu PYTHONUNBUFFERED=1
# NVLink multicast stays off (the lent machine's rule), also for every process started from here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUDGET=${BUDGET:-290}   # seconds for the whole run; BUDGET=560 leaves every step its own cap
. bench/run_steps.sh

say "## 1. machine ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
timeout 20 nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
timeout 60 python - <<'PY' 2>&1 | tee -a "$LOG"
import torch, triton, transformers
nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", nccl, "triton", triton.__version__,
      "transformers", transformers.__version__, "gpus", torch.cuda.device_count())
PY

t=$(cap "2. tests/gpu" 140)
if (( t > 0 )); then
    say "## 2. tests/gpu (timeout $t s)"
    # every file of tests/gpu in one call, the TP graph test and the graph tests first (cut last if time runs out)
    first="tests/gpu/test_graphs_tp.py tests/gpu/test_graphs.py tests/gpu/test_cuda_parity.py"
    rest=$(ls tests/gpu/test_*.py | grep -v -x -F -e tests/gpu/test_graphs_tp.py -e tests/gpu/test_graphs.py \
           -e tests/gpu/test_cuda_parity.py | tr '\n' ' ')
    timeout -s INT -k 10 "$t" python -m pytest -q -rs -p no:cacheprovider $first $rest > "$OUT/tests_gpu.txt" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"
    tail -25 "$OUT/tests_gpu.txt" >> "$LOG"
fi

t=$(cap "3. bench/gpu_engine.py" 150)
if (( t > 0 )); then
    say "## 3. bench/gpu_engine.py (timeout $t s)"
    timeout -s INT -k 10 "$t" python bench/gpu_engine.py --out "$OUT/gpu_engine.json" --tp2 auto --tp2-timeout 60 \
        --modes graphs,eager --profile > /tmp/gpu_engine.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"
    grep -v '^ ' /tmp/gpu_engine.log | grep -v '^[{}]' | tail -70 >> "$LOG"
fi

t=$(cap "3b. bench/kda_bench.py" 120)
if (( t > 0 )); then
    say "## 3b. bench/kda_bench.py (timeout $t s; fla-core from .wheels)"
    mkdir -p /tmp/pylib
    pip install -q --no-deps --no-index --target /tmp/pylib .wheels/einops-*.whl .wheels/fla_core-*.whl >/dev/null 2>&1
    PYTHONPATH=$PYTHONPATH:/tmp/pylib timeout -s INT -k 10 "$t" python bench/kda_bench.py --out "$OUT/kda_bench.json" \
        --budget 40 > /tmp/kda.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"
fi

t=$(cap "4. bench/exl3_bench.py" 90)
if (( t > 0 )); then
    say "## 4. bench/exl3_bench.py (timeout $t s; the EXL3 tests ran in step 2)"
    timeout -s INT -k 10 "$t" python bench/exl3_bench.py --budget $(( t - 15 )) --out "$OUT/exl3_bench.json" \
        > /tmp/exl3-run.log 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"
    tail -12 /tmp/exl3-run.log >> "$LOG"
fi

t=$(cap "5. bench/gpu_serve_smoke.sh" 45)
if (( t > 0 )); then
    say "## 5. bench/gpu_serve_smoke.sh (timeout $t s)"
    mkdir -p /tmp/serve-out
    OUT=/tmp/serve-out timeout "$t" bash bench/gpu_serve_smoke.sh > "$OUT/serve.log" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"
    for r in 0 1; do   # the smoke's own ranks, by the PIDs it wrote, if the timeout cut it before its kill
        pid=$(cat /tmp/pid$r 2>/dev/null) && kill -0 "$pid" 2>/dev/null && kill "$pid"
        [ -f /tmp/serve-out/rank$r.log ] && { echo "--- rank $r log (tail)"; tail -40 /tmp/serve-out/rank$r.log; } \
            >> "$OUT/serve.log"
    done
    grep -E "tok/s|health|OK|error|Error" "$OUT/serve.log" | head -12 >> "$LOG"
fi
say "## done after $(( $(date +%s) - START )) s"
