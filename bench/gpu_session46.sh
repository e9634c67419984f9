#!/usr/bin/env bash
# Session 46, one H100 or H200: the dense products with the MMA's rows in σ order, the sums stored as vectors (issue
# 19; session 45 timed the loads alone: 8 rows up to 2.1x slower, stores uncoalesced). The tree before σ is 0ef76df's
# engine (.wheels/prev/tree-0ef76df.tgz), imported through --engine or PYTHONPATH, in turn with this one.
#  1. tests/gpu/test_dense_gpu.py (the products against the dequantised weight, row invariance, graphs);
#  2. `dense_bench.py --tp 1,2 --calls 20 --rows 1,8 --modes q4,fp8`, each tree RUNS times in turn;
#  3. the 4-layer cut's decode step with q4 dense weights (graphs, b1-b4), each tree;
#  4. with what time is left, the launch forms swept on σ's tree for dsa_q_b q4 (session 45's worst at 8 rows).
#     STEPS=1234 RUNS=2 BUDGET=540 bash bench/gpu_session46.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s46-out}
T=/tmp/s46-steps
mkdir -p "$OUT" "$T" /tmp/t0ef
rm -f "$T"/*
P=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests
export PYTHONPATH=$P PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540} STEPS=${STEPS:-1234} RUNS=${RUNS:-2}
. bench/run_steps.sh
machine
wheels fla_core einops
tar xzf .wheels/prev/tree-0ef76df.tgz -C /tmp/t0ef
cp -r bench /tmp/t0ef/  # gpu_engine.py puts its own checkout first on sys.path
if want 1; then
    step "1. dense GPU tests" 150 "$T/tests.txt" python -m pytest -q -p no:cacheprovider tests/gpu/test_dense_gpu.py
fi
if want 2; then
    B="python bench/dense_bench.py --tp 1,2 --calls 20 --rows 1,8 --modes q4,fp8"
    for n in $(seq "$RUNS"); do
        step "2. dense_bench 0ef76df, run $n" 60 "$T/before$n.txt" $B --engine /tmp/t0ef --out "$T/before$n.json"
        step "2. dense_bench sigma, run $n" 60 "$T/sigma$n.txt" $B --out "$T/sigma$n.json"
    done
fi
if want 3; then
    E="python bench/gpu_engine.py --dense q4 --modes graphs --tp2 off --no-prefill"
    step "3. 4-layer decode 0ef76df" 60 "$T/step_before.txt" env PYTHONPATH=/tmp/pylib:/tmp/t0ef/bench \
        ${E/bench/\/tmp\/t0ef\/bench} --out "$T/step_before.json"
    step "3. 4-layer decode sigma" 60 "$T/step_sigma.txt" $E --out "$T/step_sigma.json"
fi
if want 4; then
    step "4. sweep dsa_q_b q4" 150 "$T/sweep.txt" python bench/dense_bench.py --sweep --swept dsa_q_b:q4 --unrolls 2 \
        --repeat 10 --out "$T/sweep.json"
fi
collect "$T" "$OUT/benches.json"
