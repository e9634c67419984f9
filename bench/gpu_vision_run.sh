#!/usr/bin/env bash
# Vision on the lent H200 (session 11), fla-core left out, ≤ BUDGET s: the GPU vision tests (the bf16 tower against the
# fp32 one; image requests with graphs and copy drafts ≡ without drafts), the tower's time per image at GLM-5.3-Flash's
# real width, and the scheduler-path GPU suites the image plumbing touches (reuse, drafts)
#     BUDGET=420 bash bench/gpu_vision_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vision-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-420}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. vision GPU tests" 90 "$OUT/vision_tests.txt" python -m pytest -q -x -p no:cacheprovider tests/gpu/test_vision_gpu.py
step "2. tower bench (real width)" 120 "$OUT/vision_bench.txt" python bench/vision_bench.py --config real --device cuda \
    --repeat 5 --out "$OUT/vision_bench_real.json"
step "3. tower bench (demo)" 30 "$OUT/vision_bench_demo.txt" python bench/vision_bench.py --config demo --device cuda \
    --repeat 5 --out "$OUT/vision_bench_demo.json"
step "4. reuse + drafts GPU suites" 150 "$OUT/sched_tests.txt" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_reuse_gpu.py tests/gpu/test_drafts_gpu.py -k "scheduler or resumed or serial or reject"
say "## done after $(( $(date +%s) - START )) s"
