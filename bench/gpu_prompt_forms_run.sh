#!/usr/bin/env bash
# The prompt path's default forms timed on the lent H200 (session 16: DSA's prompt attention on the tensor cores, the
# fused hyper-connection kernels for prompt chunks, KDA's conv as shifted multiply-adds), <= BUDGET s; run the GPU
# suite first in its own call (`BUDGET=560 bash bench/gpu_suite_run.sh`: tests/gpu/test_prompt_forms_gpu.py is in it)
#     BUDGET=560 bash bench/gpu_prompt_forms_run.sh
# 1. 4 layers (KKKD) full width, bf16, TP=1: prefill 2k/8k/32k, then transformers warm in the same process;
# 2. the released depth (45 layers, random 4-bit EXL3 experts, rank 0's TP=2 share: ShardStandIn): prefill 8k/32k
#    once each, and DSA's prompt attention against fp32 products call by call (--prompt-precision).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/prompt-forms-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh

machine
wheels
step "4 layers (KKKD), bf16, TP=1, fla-core: prefill; transformers warm" 260 "$OUT/kkkd_bf16.txt" \
    python bench/gpu_engine.py --layers KKKD --modes graphs --tp2 off --transformers --out "$OUT/kkkd_bf16.json"
step "45 layers, EXL3 experts, TP=2 shard, fla-core: prefill, DSA prompt precision" 300 "$OUT/released45.txt" \
    python bench/gpu_engine.py --layers released --exl3-experts --shard 2 --modes none --tp2 off \
    --prompt-precision --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$OUT/released45.json"
say "## done after $(( $(date +%s) - START )) s"
