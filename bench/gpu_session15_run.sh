#!/usr/bin/env bash
# Session 15's prepared H200 call (no device time was left in session 15 to run it), <= BUDGET s; the GPU suite
# first in its own call (`BUDGET=540 bash bench/gpu_suite_run.sh`: tests/gpu/test_prompt_candidates_gpu.py is in it). The
# 4-layer full-width bf16 bench at TP=1 with fla-core: the prompt-path candidates against today's form in one process
# (`--prompt-candidates`: DSA's prompt attention on the tensor cores through ops.split_product, its indexer as one
# folded product, the fused hyper-connection kernels for prompt chunks, KDA's conv as shifted multiply-adds, all) - each one's prefill 2k/8k/32k and last logits of an 8k prompt
# against today's - plus decode b1 read back and transformers warm in the same process.
#     BUDGET=590 bash bench/gpu_session15_run.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s15-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh

machine
wheels
step "4 layers (KKKD), bf16, TP=1, fla-core: prompt candidates; transformers warm" 580 "$OUT/kkkd_bf16.txt" \
    python bench/gpu_engine.py --layers KKKD --modes graphs --tp2 off --prompt-candidates --transformers \
    --out "$OUT/kkkd_bf16.json"
say "## done after $(( $(date +%s) - START )) s"
