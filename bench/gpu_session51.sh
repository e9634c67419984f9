#!/usr/bin/env bash
# Session 51: a decode step's launches (issue 20's "decode at batch 1").
#  0. the GPU tests of the session's changes: DSA's selected tokens in one launch and the one-launch pool choice
#     (test_pool_keys_gpu.py), the EXL3 routed sum adding the shared expert (test_exl3_moe_gpu.py), a step's
#     post and comb beside (test_graphs.py -k beside), and session 50's serving-path tests still due
#     (test_dense_gpu.py, test_drafts_gpu.py -k "q4_weights or exl3");
#  1. the served form's cut (rank 0's TP=2 share, EXL3 experts, q4 dense, graphs), b1-b4 steps and the b1 step
#     after prompts of 1.5k / 3k / 6k / 30k tokens (spans 2k, 4k, 8k, 32k: every pool chosen; one program a query;
#     the one-launch choice of two blocks; segments): PREV's tree (session 50), then this tree;
#  2. this tree with a step's post and comb in `_hc_mix` (--hc-gates-inline; call 2 ran it as --hc-gates-beside,
#     before the beside form became the default);
#  3. the cut's step traced (this tree);
#  4. prefill at 8k and 32k, PREV's tree then this one: the 4-layer bf16 bench and the served form's cut;
#  5. (an H200) the released depth's decode, b1-b4 and the b1 step at a 30k context: PREV's tree, then this one.
#     PREV=aff38eb STEPS=01 BUDGET=540 bash bench/gpu_session51.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s51-out}
T=/tmp/s51-steps
mkdir -p "$OUT" "$T"
rm -f "$T"/*
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-540}
STEPS=${STEPS:-0123}
PREV=${PREV:-aff38eb}
. bench/run_steps.sh
machine
wheels fla_core einops
if want 0; then
    step "0. the session's GPU tests" 200 "$T/tests.txt" python -m pytest -q -p no:cacheprovider \
        tests/gpu/test_pool_keys_gpu.py tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_graphs.py \
        -k "pool_tokens or top_pools or graphed or beside or replays or cpu_tokens or batch or graph_decode"
    step "0. session 50's serving-path tests" 150 "$T/serving.txt" python -m pytest -q -p no:cacheprovider \
        tests/gpu/test_dense_gpu.py tests/gpu/test_drafts_gpu.py -k "q4_weights or exl3"
fi
S="bench/gpu_engine.py --layers KKKD --exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off --no-prefill
    --long-contexts 1500,3000,6000,30000"
if want 1; then
    prev_tree
    step "1. EXL3 q4 cut's decode, $PREV" 130 "$T/cut_before.txt" env PYTHONPATH="/tmp/pylib:$OLD/bench" \
        python ${S/bench/$OLD/bench} --out "$T/cut_before.json"
    step "1. EXL3 q4 cut's decode, this tree" 130 "$T/cut_after.txt" python $S --out "$T/cut_after.json"
fi
want 2 && step "2. EXL3 q4 cut's decode, gates inline" 130 "$T/cut_gates.txt" python $S --hc-gates-inline \
    --out "$T/cut_gates.json"
if want 3; then
    step "3. EXL3 q4 cut's step trace" 120 "$T/trace.txt" python bench/decode_trace.py --exl3-experts \
        --shard 2 --dense q4 --out "$T/trace_decode_kkkd_exl3_q4.json"
fi
P="--modes none --tp2 off --prefill-lengths 8192,32768 --prefill-repeats 2"
if want 4; then
    prev_tree
    for form in "bf16:--layers KKKD" "exl3:--layers KKKD --exl3-experts --shard 2 --dense q4"; do
        name=${form%%:*}; flags=${form#*:}
        step "4. $name prefill, $PREV" 100 "$T/prefill_${name}_before.txt" env PYTHONPATH="/tmp/pylib:$OLD/bench" \
            python $OLD/bench/gpu_engine.py $flags $P --out "$T/prefill_${name}_before.json"
        step "4. $name prefill, this tree" 100 "$T/prefill_${name}_after.txt" python bench/gpu_engine.py $flags $P \
            --out "$T/prefill_${name}_after.json"
    done
fi
R="bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off --no-prefill
    ${LONG-"--long-contexts 30000"}"  # LONG= leaves the long-context step out
if want 5; then  # an H200: the released depth's weights at rank 0's TP=2 share are 74.6 GiB
    prev_tree
    step "5. released decode, $PREV" 200 "$T/released_before.txt" env PYTHONPATH="/tmp/pylib:$OLD/bench" \
        python ${R/bench/$OLD/bench} --out "$T/released_before.json"
    step "5. released decode, this tree" 200 "$T/released_after.txt" python $R --out "$T/released_after.json"
fi
for f in "$T"/trace_*.json; do [ -f "$f" ] && gzip -c "$f" > "$OUT/$(basename "$f").gz" && rm "$f"; done
collect "$T" "$OUT/benches.json"
