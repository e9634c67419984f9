#!/usr/bin/env bash
# Session 12's H200 call, ≤ BUDGET s: the video tests against the reference processor (torchvision is installed
# there), the GPU vision tests (the tower then encoded each frame alone; now one call per media item), the tower's time per image and per clip at
# the real width, then the DENSE products (tests/gpu/test_dense_gpu.py, bench/dense_bench.py --tp 1). When it ran
# (before 0b105a9), q4 codes were made floats by the 2^23 trick; no faster, so taken back (docs/BENCHMARKS.md). `.wheels` carries PyAV and the server's pydantic/fastapi.
#     BUDGET=480 bash bench/gpu_session12_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s12-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
. bench/run_steps.sh

machine
wheels
step "1. video tests (reference processor)" 100 "$OUT/video_tests.txt" python -m pytest -q -rfs -p no:cacheprovider \
    tests/engine/test_vision_video.py
step "2. GPU vision + dense tests" 150 "$OUT/gpu_tests.txt" python -m pytest -q -rf -p no:cacheprovider \
    tests/gpu/test_vision_gpu.py tests/gpu/test_dense_gpu.py
step "3. dense products (q4 2^23 codes)" 120 "$OUT/dense_bench.txt" python bench/dense_bench.py --tp 1 \
    --out "$OUT/dense_products.json"
step "4. tower bench with clips (real width)" 120 "$OUT/video_bench.txt" python bench/vision_bench.py --config real \
    --device cuda --repeat 5 --videos --out "$OUT/video_bench_real.json"
say "## done after $(( $(date +%s) - START )) s"
