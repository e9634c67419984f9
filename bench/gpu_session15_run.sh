#!/usr/bin/env bash
# Session 15's first H200 call, ≤ BUDGET s: the whole GPU suite (fla-core left out, as bench/gpu_suite_run.sh), then
# the 4-layer full-width bf16 bench at TP=1 with fla-core: DSA's prompt attention on the tensor cores
# (ops.split_product, SparseMLA.TENSOR_CORES) against the fp32 products the engine runs today — precision on an 8k prompt and prefill 2k/8k/32k both
# ways — decode b1 read back, and transformers warm in the same process.
#     BUDGET=590 bash bench/gpu_session15_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s15-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh

machine
wheels fla_core einops
step "tests/gpu" 260 "$OUT/gpu_suite.txt" python -m pytest -q -p no:cacheprovider --durations=10 tests/gpu
wheels
step "4 layers (KKKD), bf16, TP=1, fla-core: DSA split vs fp32; transformers warm" 400 "$OUT/kkkd_bf16.txt" \
    python bench/gpu_engine.py --layers KKKD --modes graphs --tp2 off --dsa-compare --transformers \
    --out "$OUT/kkkd_bf16.json"
say "## done after $(( $(date +%s) - START )) s"
