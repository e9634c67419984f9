#!/usr/bin/env bash
# Session 29's second device call, written when no device was lent (run it after bench/gpu_session28_call1.sh in the
# next session that has one), <= BUDGET s: long contexts on the GPU — one DSA layer's prompt chunk of 2,048 queries
# at 32k..1M spans, its time and the memory it takes beyond the cache (bench/long_prompt_bench.py: the prompt path
# that reads only what it uses, session 29), then the released depth's prompts of 8k / 32k / 128k / 256k tokens
# (the reference's page: 1,952 / 1,979 / 1,838 / 1,642 tok/s on two Sparks) and the batch-1 serving step after each
# (bench/gpu_engine.py --long-contexts).
# Session 30 ran it before step 2 took fla-core (bench/results/2026-12-05-h200-session30-call2-*), then step 2 with
# it in bench/gpu_session30_call1.sh.
#     BUDGET=590 bash bench/gpu_session29_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s29b-out}
mkdir -p "$OUT" /tmp/s29b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh
T=/tmp/s29b-steps

machine
wheels fla_core einops
step "1. a DSA layer's 2k prompt chunk at 32k..1M spans" 150 "$T/long_prompt.txt" python bench/long_prompt_bench.py \
    --spans 32768,131072,524288,1048576 --kv bf16,fp8 --out "$T/long_prompt_bench.json"
fla_aside  # the served KDA: without fla-core it takes the torch reference form (session 30's first run of this call)
step "2. released q4: prompts of 8k..256k and the batch-1 step after each" 400 "$T/long.txt" $FLA python \
    bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off --no-prefill \
    --long-contexts 8192,32768,131072,262144 --out "$T/long_context_released_q4.json"
collect "$T" "$OUT/benches.json"
