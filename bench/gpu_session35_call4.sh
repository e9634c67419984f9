#!/usr/bin/env bash
# Session 35's fourth call (any GPU, warm after call 3), <= BUDGET s: the 4-layer bf16 prefill (issue 20's bench) with
# this tree and with 7bcf3c0's (.wheels/prev/tree-7bcf3c0.tgz) in turn, then this tree's chunk traced.
#     BUDGET=300 bash bench/gpu_session35_call4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s35d-out}
mkdir -p "$OUT" /tmp/s35d-steps /tmp/old
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s35d-steps

machine
[ -d /tmp/pylib/fastapi ] || wheels fla_core einops
fla_aside
tar xzf .wheels/prev/tree-7bcf3c0.tgz -C /tmp/old
step "1. prefill, this tree" 150 "$T/new_a.txt" $FLA python bench/gpu_engine.py --layers KKKD \
    --modes none --tp2 off --prefill-lengths 2048,8192 --out "$T/new_a.json"
step "2. prefill, 7bcf3c0" 60 "$T/old_a.txt" env -C /tmp/old $FLA python bench/gpu_engine.py \
    --layers KKKD --modes none --tp2 off --prefill-lengths 2048,8192 --out "$T/old_a.json"
step "3. prefill, this tree again" 50 "$T/new_b.txt" $FLA python bench/gpu_engine.py --layers KKKD \
    --modes none --tp2 off --prefill-lengths 2048,8192 --out "$T/new_b.json"
step "4. the chunk traced" 50 "$T/trace.txt" $FLA python bench/decode_trace.py --layers KKKD --prefill 8192 \
    --out "$OUT/trace_prefill_kkkd_bf16.json.gz"
collect "$T" "$OUT/benches.json"
