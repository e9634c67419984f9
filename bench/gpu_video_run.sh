#!/usr/bin/env bash
# Video on the lent H200 (session 12), ≤ BUDGET s: tests/engine/test_vision_video.py where torchvision is installed
# (the reference video processor's parity tests run there, skipped on the CPU machine), then the tower's time per
# clip at GLM-5.3-Flash's real width and the CPU's decoding (bench/vision_bench.py --videos). (tests/engine/test_vision_preprocess.py is left out: the machine's transformers 5.17 has an older image
# processor than the one this project pins.) `.wheels` carries PyAV and the server's
# pydantic/fastapi.
#     BUDGET=300 bash bench/gpu_video_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/video-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh

machine
wheels
python -c "import torchvision, transformers, av; print('torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'av', av.__version__)" 2>&1 | tee -a "$LOG"
step "1. video tests with the reference processor" 100 "$OUT/video_tests.txt" python -m pytest -q -rfs -p no:cacheprovider \
    tests/engine/test_vision_video.py
step "2. tower bench with clips (real width)" 150 "$OUT/video_bench.txt" python bench/vision_bench.py --config real \
    --device cuda --repeat 5 --videos --out "$OUT/video_bench_real.json"
say "## done after $(( $(date +%s) - START )) s"
