#!/usr/bin/env bash
# Session 42's fallback call (an H100: the released depth needs an H200), <= BUDGET s: the 4-layer cut's prefill
# with EXL3 experts and q4 dense weights at TP=2's shard, with fla-core (KDA's prompt form as served), this tree and
# 7bcf3c0's (.wheels/prev/tree-7bcf3c0.tgz: before sessions 35-42's prompt kernels) in turn, then this tree again.
#     BUDGET=300 bash bench/gpu_session42_call3.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s42c3-out}
mkdir -p "$OUT" /tmp/s42c3-steps /tmp/old
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-300}
. bench/run_steps.sh
T=/tmp/s42c3-steps
rm -f "$T"/*
P="--layers KKKD --exl3-experts --shard 2 --dense q4 --modes none --tp2 off --prefill-lengths 2048,8192"

machine
wheels fla_core einops
fla_aside
tar xzf .wheels/prev/tree-7bcf3c0.tgz -C /tmp/old
cp bench/exl3_prompt_bench.py /tmp/old/bench/  # gpu_engine's --exl3-experts imports its random_bank
step "1. 4-layer prefill, this tree (compiles fla-core's kernels)" 110 "$T/new_a.txt" $FLA python bench/gpu_engine.py \
    $P --prefill-repeats 3 --out "$T/new_a.json"
step "2. 4-layer prefill, 7bcf3c0" 80 "$T/old_a.txt" env -C /tmp/old $FLA python bench/gpu_engine.py $P \
    --prefill-repeats 3 --out "$T/old_a.json"
step "3. 4-layer prefill, this tree again" 70 "$T/new_b.txt" $FLA python bench/gpu_engine.py $P --prefill-repeats 3 \
    --out "$T/new_b.json"
collect "$T" "$OUT/benches.json"
