#!/usr/bin/env bash
# Session 41's device call (an H100 or H200), <= BUDGET s: a prompt chunk's EXL3 experts on Hopper with the warpgroup
# MMAs asynchronous (a tile decoded while the tile before is multiplied) and x's two fp16 operands made once by the
# kernels before, copied into a ring of shared buffers by cp.async (`triton_exl3._exl3_grouped_wgmma`):
#  1. the GPU tests of the grouped prompt products (every form and ring against the expert loop; widths, codebooks),
#     recording their Triton launches (bench/record_triton_launches.sh: tests/fixtures/triton_launches.json);
#  2. bench/exl3_prompt_bench.py at TP=2's shard and TP=1, 2k and 8k tokens: the tree before (0ad01cd, from
#     .wheels/prev/tree-0ad01cd.tgz) and this one in turn, the ring's variants, and the outputs' bits (sha256: the
#     same inputs, so equal hashes are equal bits);
#  3. the 4-layer cut's prefill with EXL3 experts and q4 dense weights at TP=2's shard, both trees in turn.
#     BUDGET=480 bash bench/gpu_session41_call.sh      (STEPS=23: only the benches; with 4 the tree before again)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s41-out}
mkdir -p "$OUT" /tmp/s41-steps /tmp/old
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-480}
STEPS=${STEPS:-123}
. bench/run_steps.sh
T=/tmp/s41-steps
rm -f "$T"/*

machine
wheels fla_core einops
tar xzf .wheels/prev/tree-0ad01cd.tgz -C /tmp/old
NEW=$PWD
B="--tp 2 --tokens 2048,8192 --no-bf16 --no-loop"
want 2 && step "2a. exl3_prompt_bench, 0ad01cd" 60 "$T/b_old.txt" env -C /tmp/old PYTHONPATH=/tmp/pylib:. \
    python "$NEW/bench/exl3_prompt_bench.py" $B --variants "" --out "$T/prompt_old.json"
want 2 && step "2b. exl3_prompt_bench, this tree" 110 "$T/c_new.txt" python bench/exl3_prompt_bench.py $B \
    --variants ${VARIANTS:-kb2,no_maxnreg,bm64} --out "$T/prompt_new.json"
want 4 && step "2c. exl3_prompt_bench, 0ad01cd again" 45 "$T/d_old2.txt" env -C /tmp/old PYTHONPATH=/tmp/pylib:. \
    python "$NEW/bench/exl3_prompt_bench.py" $B --variants "" --out "$T/prompt_old2.json"
# the tests of the grouped products and the rotations around them, recording what they compile for the GB10's
# compile test (the split rotation and SwiGLU, the dot form's fp16 operands)
want 1 && step "1. grouped prompt products on the GPU, recorded" 170 "$T/a_tests.txt" env OUT="$OUT" LIMIT=160 \
    TESTS="tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_exl3_gpu.py::test_prompt_chunk_path" \
    KERNELS="_exl3_grouped" bash bench/record_triton_launches.sh
P="--layers KKKD --exl3-experts --shard 2 --dense q4 --modes none --tp2 off --prefill-lengths 2048,8192 --prefill-repeats 3"
want 3 && step "3a. 4-layer EXL3 prefill, this tree" 70 "$T/e_pre_new.txt" python bench/gpu_engine.py $P \
    --out "$T/prefill_new.json"
want 3 && step "3b. 4-layer EXL3 prefill, 0ad01cd" 70 "$T/f_pre_old.txt" env -C /tmp/old PYTHONPATH=/tmp/pylib:. \
    python bench/gpu_engine.py $P --out "$T/prefill_old.json"
collect "$T" "$OUT/benches.json"
