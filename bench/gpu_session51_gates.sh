#!/usr/bin/env bash
# Session 51: a step's post and comb beside (the default since its call 3) against --hc-gates-inline, alternately,
# twice each (the served form's cut, b1-b4 and the b1 step at spans 4k and 32k), into $OUT/gates.json. Call 3 ran
# the same with --hc-gates-beside against the then default (inline), beside first.
#     OUT=/tmp/g bash bench/gpu_session51_gates.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s51-gates}
T=/tmp/s51-gates-steps
mkdir -p "$OUT" "$T"
rm -f "$T"/*
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-200}
STEPS=1
. bench/run_steps.sh
[ -d /tmp/pylib ] || wheels fla_core einops
S="python bench/gpu_engine.py --layers KKKD --exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off --no-prefill
    --long-contexts 3000,30000"
i=0
for flag in "" --hc-gates-inline "" --hc-gates-inline; do
    i=$((i + 1))
    step "gates ${flag:-beside} ($i)" 60 "$T/gates_$i.txt" $S $flag --out "$T/gates_$i.json"
done
collect "$T" "$OUT/gates.json"
