#!/usr/bin/env bash
# Session 35's first call (any GPU), <= BUDGET s: where a 4-layer bf16 prompt chunk's time goes (issue 20's bench:
# full width, TP=1, bf16 experts through _grouped_mm, fla-core's KDA), and its prefill rates with 2,048- and
# 8,192-token chunks.
#     BUDGET=540 bash bench/gpu_session35_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s35a-out}
mkdir -p "$OUT" /tmp/s35a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}
. bench/run_steps.sh
T=/tmp/s35a-steps

machine
wheels
step "1. the 2k chunk ending at 8k, traced (KKKD, bf16)" 200 "$T/trace.txt" python bench/decode_trace.py \
    --layers KKKD --prefill 8192 --out "$OUT/trace_prefill_kkkd_bf16.json.gz"
step "2. prefill rates, 2,048-token chunks" 150 "$T/rates_2k.txt" python bench/gpu_engine.py --layers KKKD \
    --modes none --tp2 off --prefill-lengths 2048,8192,32768 --out "$T/rates_2k.json"
step "3. prefill rates, 8,192-token chunks" 150 "$T/rates_8k.txt" python bench/gpu_engine.py --layers KKKD \
    --modes none --tp2 off --prefill-lengths 8192,32768 --prefill-chunk 8192 --out "$T/rates_8k.json"
collect "$T" "$OUT/benches.json"
