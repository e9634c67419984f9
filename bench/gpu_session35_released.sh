#!/usr/bin/env bash
# For the next device call with an H200 (the released depth's EXL3 experts at rank 0's TP=2 share are ~76 GB), not
# run in session 35 (no device time left): the released depth's q4 prefill at 8k / 32k with fla-core, this tree
# and 7bcf3c0's (.wheels/prev/tree-7bcf3c0.tgz: before session 35's prompt kernels) in turn, to measure at the served
# shapes (32 heads a rank) what the 4-layer TP=1 bench gained (+13 % / +21 % on an H100); then this tree's decode.
#     BUDGET=590 bash bench/gpu_session35_released.sh      (STEPS=142: the steps in that order, without step 3)
# (.wheels/prev/tree-7bcf3c0.tgz, if absent: git archive 7bcf3c0 engine bench/gpu_engine.py bench/decode_trace.py
#  config | gzip > .wheels/prev/tree-7bcf3c0.tgz)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s35r-out}
mkdir -p "$OUT" /tmp/s35r-steps /tmp/old
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
STEPS=${STEPS:-1234}
. bench/run_steps.sh
T=/tmp/s35r-steps
R="--layers released --exl3-experts --shard 2 --dense q4 --tp2 off"

machine
wheels fla_core einops
fla_aside
tar xzf .wheels/prev/tree-7bcf3c0.tgz -C /tmp/old
cp bench/exl3_prompt_bench.py /tmp/old/bench/  # gpu_engine's --exl3-experts imports its random_bank
s1() { step "1. released prefill, this tree (compiles fla-core's kernels)" 240 "$T/new_a.txt" $FLA python bench/gpu_engine.py \
    $R --modes none --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/new_a.json"; }
s2() { step "2. released prefill, 7bcf3c0" 120 "$T/old_a.txt" env -C /tmp/old $FLA python bench/gpu_engine.py $R \
    --modes none --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/old_a.json"; }
s3() { step "3. released prefill, this tree again" 100 "$T/new_b.txt" $FLA python bench/gpu_engine.py $R --modes none \
    --prefill-lengths 8192,32768 --prefill-repeats 1 --out "$T/new_b.json"; }
s4() { step "4. released decode, this tree" 80 "$T/decode.txt" python bench/gpu_engine.py $R --modes graphs --no-prefill \
    --out "$T/decode.json"; }
for (( i = 0; i < ${#STEPS}; i++ )); do "s${STEPS:i:1}"; done
collect "$T" "$OUT/benches.json"
