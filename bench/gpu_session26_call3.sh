#!/usr/bin/env bash
# Session 26's third call, <= BUDGET s: issue 20's ratio to transformers' warm glm5_next in the same process (session
# 23's attempt ran out of its 200 s step) — the 4-layer full-width bf16 config at TP=1, fla-core installed (the
# engine's shipped choices; transformers' KDA uses fla-core too), our decode (graphs, each token read back) and
# prefill 2k/8k, then transformers' generate and forwards, warm.
#     BUDGET=540 bash bench/gpu_session26_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s26c-out}
mkdir -p "$OUT" /tmp/s26c-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}
. bench/run_steps.sh
T=/tmp/s26c-steps

machine
wheels
step "1. 4 layers bf16 TP=1: the engine, then transformers warm" 520 "$T/kkkd_bf16.txt" \
    python bench/gpu_engine.py --layers KKKD --modes graphs --tp2 off --prefill-lengths 2048,8192 --transformers \
    --out "$T/kkkd_bf16.json"
collect "$T" "$OUT/benches.json"
