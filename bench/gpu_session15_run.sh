#!/usr/bin/env bash
# Session 15's prepared H200 calls (no device time was left in session 15 to run them), <= BUDGET s each; the GPU
# suite first in its own call (`BUDGET=540 bash bench/gpu_suite_run.sh`: tests/gpu/test_prompt_candidates_gpu.py is in
# it). Each call times the prompt-path candidates against today's form in one process (`--prompt-candidates`: DSA's
# prompt attention on the tensor cores through ops.split_product, its indexer as one folded product, the fused
# hyper-connection kernels for prompt chunks, KDA's conv as shifted multiply-adds, all) - each one's prefill and last
# logits of an 8k prompt against today's:
#     BUDGET=590 bash bench/gpu_session15_run.sh kkkd      # 4 layers full width, bf16, TP=1: prefill 2k/8k/32k, plus
#                                                          # decode b1 read back and transformers warm in the process
#     BUDGET=590 bash bench/gpu_session15_run.sh released  # 45 layers, random 4-bit EXL3 experts, rank 0's TP=2
#                                                          # share (ShardStandIn): prefill 8k/32k once each
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s15-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh

machine
wheels
case "${1:-kkkd}" in
    kkkd)
        step "4 layers (KKKD), bf16, TP=1, fla-core: prompt candidates; transformers warm" 580 "$OUT/kkkd_bf16.txt" \
            python bench/gpu_engine.py --layers KKKD --modes graphs --tp2 off --prompt-candidates --transformers \
            --out "$OUT/kkkd_bf16.json" ;;
    released)
        step "45 layers, EXL3 experts, TP=2 shard, fla-core: prompt candidates" 580 "$OUT/released45_candidates.txt" \
            python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --modes none --tp2 off \
            --no-prefill --prompt-candidates --prefill-lengths 8192,32768 --prefill-repeats 1 \
            --out "$OUT/released45_candidates.json" ;;
    *) say "unknown part '$1': kkkd or released"; exit 2 ;;
esac
say "## done after $(( $(date +%s) - START )) s"
