#!/usr/bin/env bash
# Session 46, one H100 or H200: the dense products with the MMA's rows in σ order, the sums stored as vectors (issue
# 19; session 45 timed the loads alone: 8 rows up to 2.1x slower, stores uncoalesced). The tree before σ is 0ef76df's
# engine (.wheels/prev/tree-0ef76df.tgz: `bench/fetch_wheels.sh 0ef76df` makes it and the wheels carried), imported
# through --engine or PYTHONPATH, in turn with this one.
#  1. tests/gpu/test_dense_gpu.py (the products against the dequantised weight, row invariance, graphs);
#  2. `dense_bench.py --tp 1,2 --calls 20 --rows 1,8 --modes q4,fp8`, each tree RUNS times in turn;
#  3. the 4-layer cut's decode step with q4 dense weights (graphs, b1-b4), each tree;
#  4. with what time is left, dsa_q_b q4's launch forms swept (session 45's worst at 8 rows; call 1: σ for all);
#  5. the launch forms swept for the other served weights (q4; the LM head fp8), or SWEPT's, on SWEEP_BASE's tuning
#     if set (e.g. SWEEP_BASE=sigma=1);
#  6. Nsight Compute on kda_in_proj q4 at one row (the table's launch), each tree: occupancy, registers, stalls.
#  7. step 2's run of this tree again with σ for every weight (the table: fp8 only), compiled for any row count
#     (--tuning sigma=1,one_row=0), and 8. the same with a one-row launch compiled on its own (call 1's σ form).
#     STEPS=1234 RUNS=2 BUDGET=540 bash bench/gpu_session46.sh   (call 1, σ for every weight; call 2: STEPS=12378 RUNS=1)
#     Session 47: STEPS=123785 RUNS=1 BUDGET=500 SWEEP_BASE=sigma=1 (the table as session 46 left it: σ for fp8), then
#     STEPS=123 RUNS=2 BUDGET=300 with the table that takes σ for q4 below TALL and the any-row compile by loop turns;
#     then PREV=3f8d23a TPS=1,2,3 STEPS=12 RUNS=1 (PROGRAMS 512 and TALL_GROUPS against the table before them).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s46-out}
T=/tmp/s46-steps
PREV=${PREV:-0ef76df}  # the tree timed against (.wheels/prev/tree-$PREV.tgz)
mkdir -p "$OUT" "$T"
rm -f "$T"/*
P=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests
export PYTHONPATH=$P PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540} STEPS=${STEPS:-1234} RUNS=${RUNS:-2}
. bench/run_steps.sh
machine
wheels fla_core einops
prev_tree
B="python bench/dense_bench.py --tp ${TPS:-1,2} --calls 20 --rows 1,8 --modes q4,fp8"
if want 1; then
    step "1. dense GPU tests" 150 "$T/tests.txt" python -m pytest -q -p no:cacheprovider tests/gpu/test_dense_gpu.py
fi
if want 2; then
    for n in $(seq "$RUNS"); do
        step "2. dense_bench $PREV, run $n" 60 "$T/before$n.txt" $B --engine "$OLD" --out "$T/before$n.json"
        step "2. dense_bench this tree, run $n" 60 "$T/sigma$n.txt" $B --out "$T/sigma$n.json"
    done
fi
if want 3; then
    dense_steps "$T" "$PREV" "$OLD" sigma
fi
if want 4; then
    step "4. sweep dsa_q_b q4" 150 "$T/sweep.txt" python bench/dense_bench.py --sweep --swept dsa_q_b:q4 --unrolls 2 \
        --repeat 10 --out "$T/sweep.json"
fi
if want 7; then
    step "7. dense_bench sigma=1,one_row=0" 60 "$T/sigma_any.txt" $B --tuning sigma=1,one_row=0 --out "$T/sigma_any.json"
fi
if want 8; then
    step "8. dense_bench sigma=1,one_row=1" 60 "$T/sigma_own.txt" $B --tuning sigma=1,one_row=1 --out "$T/sigma_own.json"
fi
if want 5; then
    W=kda_in_proj:q4,tp2/kda_in_proj:q4,dsa_o_proj:q4,dense_down:q4,kda_o_proj:q4,shared_gate_up:q4,lm_head:fp8
    W=${SWEPT:-$W,tp2/lm_head:fp8}
    step "5. sweep the served weights" 240 "$T/sweep_all.txt" python bench/dense_bench.py --sweep --swept "$W" \
        --repeat 10 ${SWEEP_BASE:+--tuning $SWEEP_BASE} --out "$T/sweep_all.json"
fi
if want 6; then
    N="ncu --clock-control none -k regex:_dense_rows -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis"
    D="bench/dense_bench.py --tp 1 --calls 1 --rows 1 --modes q4 --names kda_in_proj"
    step "6. ncu $PREV" 60 "$T/ncu_before.txt" $N python $D --engine "$OLD"
    step "6. ncu sigma" 60 "$T/ncu_sigma.txt" $N python $D
fi
collect "$T" "$OUT/benches.json"
