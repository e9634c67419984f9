#!/usr/bin/env bash
# Session 44's words device call (an H100 or H200), <= BUDGET s: q4's scale and offset of a group as one 32-bit
# word an output (`QuantWeight.words`; the kernel loads 8 words a group a thread where it loaded 16 halves):
#  1. tests/gpu/test_dense_gpu.py (every launch form against the exact product; rows invariant; graphs; the model);
#  2. bench/dense_bench.py at 1 and 8 rows, q4 and fp8, TP=1 and TP=2's shapes, 20 calls a graph: this tree and
#     f93da7b (the tree before, .wheels/prev/tree-f93da7b.tgz, through --engine) in turn, twice;
#     then, this tree only, q4 at TP=1 with 256 outputs a program on 2 warps (128 a warp: x's loads a weight byte
#     halved), unrolled as the table says and not;
#  3. the 4-layer cut's decode step with q4 dense weights (EXL3 experts, TP=2's shard, graphs): both trees in turn;
#  4. on a GPU of more than 100 GB (an H200): the released depth's decode step, both trees in turn.
#     BUDGET=500 bash bench/gpu_session44_words.sh      (STEPS=234: without the tests)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s44b-out}
mkdir -p "$OUT" /tmp/s44b-steps /tmp/old
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-500}
STEPS=${STEPS:-1234}
. bench/run_steps.sh
T=/tmp/s44b-steps
rm -f "$T"/*

machine
wheels fla_core einops
tar xzf .wheels/prev/tree-f93da7b.tgz -C /tmp/old
want 1 && step "1. tests/gpu/test_dense_gpu.py" 150 "$T/a_tests.txt" python -m pytest -q tests/gpu/test_dense_gpu.py
D="--tp 1,2 --calls 20 --rows 1,8 --modes q4,fp8"
for run in 1 2; do
    want 2 && step "2a. dense_bench, this tree ($run)" 60 "$T/b_new$run.txt" python bench/dense_bench.py $D \
        --out "$T/dense_new$run.json"
    want 2 && step "2b. dense_bench, f93da7b ($run)" 60 "$T/c_old$run.txt" python bench/dense_bench.py $D \
        --engine /tmp/old --out "$T/dense_old$run.json"
done
P="--tp 1 --calls 20 --rows 1,8 --modes q4"
want 2 && step "2c. dense_bench, 128 outputs a warp" 60 "$T/h_wide.txt" python bench/dense_bench.py $P \
    --tuning block_o=256,num_warps=2 --out "$T/dense_wide.json"
want 2 && step "2d. dense_bench, 128 outputs a warp, one group a step" 60 "$T/i_wide1.txt" python bench/dense_bench.py \
    $P --tuning block_o=256,num_warps=2,unroll=1 --out "$T/dense_wide1.json"
E="--exl3-experts --shard 2 --dense q4 --modes graphs --tp2 off --no-prefill"
want 3 && step "3a. 4-layer q4 decode, this tree" 60 "$T/d_new.txt" python bench/gpu_engine.py --layers KKKD $E \
    --out "$T/step_new.json"
want 3 && step "3b. 4-layer q4 decode, f93da7b" 60 "$T/e_old.txt" env -C /tmp/old PYTHONPATH=/tmp/pylib:. \
    python bench/gpu_engine.py --layers KKKD $E --out "$T/step_old.json"
big=$(python -c "import torch; print(int(torch.cuda.get_device_properties(0).total_memory > 100e9))")
if [ "$big" = 1 ]; then
    want 4 && step "4a. released q4 decode, this tree" 90 "$T/f_new.txt" python bench/gpu_engine.py --layers released \
        $E --out "$T/released_new.json"
    want 4 && step "4b. released q4 decode, f93da7b" 90 "$T/g_old.txt" env -C /tmp/old PYTHONPATH=/tmp/pylib:. \
        python bench/gpu_engine.py --layers released $E --out "$T/released_old.json"
fi
collect "$T" "$OUT/benches.json"
