#!/usr/bin/env bash
# Session 44, one H100 or H200: what binds the q4 decode products (issue 19). The table's form, then q4 unrolled by
# 4 and by 1, then four diagnostic trees (bench/dense_diag_trees.py, from f93da7b's engine: .wheels/prev/
# tree-f93da7b.tgz), each with one part of _dense_rows' group taken out (wrong sums, timing only: nothing of them is
# served or committed under engine/): nosx (no Σ x MMA), nounpack (the nibbles moved, not unpacked), both, noscales
# (no scale or offset loads). Run at f93da7b (since 5e3f661 the q4 scales load as one word: "table" differs).
#     BUDGET=400 bash bench/gpu_session44_diag.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s44-out}
mkdir -p "$OUT" /tmp/s44-steps /tmp/diag
export PYTHONPATH=/tmp/pylib:.:bench PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-400}
. bench/run_steps.sh
T=/tmp/s44-steps
machine
wheels fla_core einops
mkdir -p /tmp/t93 && tar xzf .wheels/prev/tree-f93da7b.tgz -C /tmp/t93
python bench/dense_diag_trees.py /tmp/t93 /tmp/diag
B="python bench/dense_bench.py --tp 1 --calls 20 --rows 1,8 --modes q4 --names kda_in_proj,kda_o_proj,dsa_o_proj,dense_down,dsa_q_b,lm_head"
step "table" 60 "$T/table.txt" $B --out "$T/table.json"
step "unroll 4" 60 "$T/unroll4.txt" $B --tuning unroll=4 --out "$T/unroll4.json"
step "unroll 1" 60 "$T/unroll1.txt" $B --tuning unroll=1 --out "$T/unroll1.json"
for v in nosx nounpack both noscales; do
    step "diag $v" 60 "$T/$v.txt" $B --engine /tmp/diag/dt-$v --out "$T/$v.json"
done
step "table again" 60 "$T/table2.txt" $B --out "$T/table2.json"
collect "$T" "$OUT/benches.json"
