#!/usr/bin/env bash
# The whole of tests/gpu on the lent H200 in one call, <= BUDGET s (session 26: 258 s). pytest-xdist spreads the
# files over worker processes on the one GPU (the compiles are the CPU's): test_exl3_gpu.py (~370 independent cases,
# no shared fixtures) test by test, every other file whole on one worker (their module fixtures build a model once). fla-core
# is left out of that run (decode and the tiny models' prompts take the engine's own kernels); then the files whose
# result fla-core could change (its KDA prompt form) run again with it installed.
#     BUDGET=580 [STEPS=12] bash bench/gpu_suite_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/suite-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-580}
STEPS=${STEPS:-12}
. bench/run_steps.sh

machine
wheels fla_core einops
fla_aside
t=0
want 1 && t=$(cap "1. tests/gpu" 400)
if (( t > 0 )); then
    say "## 1. tests/gpu, fla-core left out: test_exl3_gpu.py -n 6 --dist load beside the rest -n 8 --dist loadfile (timeout $t s)"
    timeout -s INT -k 10 "$t" python -m pytest -q -p no:cacheprovider -n 8 --dist loadfile --durations=20 tests/gpu \
        --ignore=tests/gpu/test_exl3_gpu.py > "$OUT/suite_rest.txt" 2>&1 &
    rest=$!
    timeout -s INT -k 10 "$t" python -m pytest -q -p no:cacheprovider -n 6 --dist load --durations=10 \
        tests/gpu/test_exl3_gpu.py > "$OUT/suite_exl3.txt" 2>&1 &
    exl3=$!
    wait $rest; say "the rest: exit $? after $(( $(date +%s) - START )) s"
    wait $exl3; say "test_exl3_gpu.py: exit $? after $(( $(date +%s) - START )) s"
    for f in "$OUT/suite_rest.txt" "$OUT/suite_exl3.txt"; do
        { grep -E "^(FAILED|ERROR)|passed|failed" "$f" || tail -8 "$f"; } | tail -25 >> "$LOG"
    done
fi
want 2 && step "2. with fla-core: its KDA prompt form, its shipped choices, and the files it could change" 240 "$OUT/suite_fla.txt" \
    $FLA python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile --durations=10 tests/gpu/test_kda_prompt_gpu.py \
    tests/gpu/test_fla_configs_gpu.py tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_cuda_parity.py
say "## done after $(( $(date +%s) - START )) s"
