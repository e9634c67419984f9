#!/usr/bin/env bash
# Session 40's device call (any GPU), <= BUDGET s: a decode step's sampling passes replayed from CUDA graphs
# (`sampling.DrawGraphs`, the scheduler's draws with --cuda-graphs on):
#  1. the GPU tests of sampling (graphed passes draw the host's tokens; the scheduler's draws graphed only with
#     --cuda-graphs) and of the serving paths that sample on the GPU (drafts, MTP, structured outputs, reuse);
#  2. bench/sampling_bench.py on the GPU (a row alone; 1, 4 and 16 rows together, eager and graphed, ms a row);
#  3. bench/served_decode_bench.py: decode through the scheduler at 154,880 tokens, 4 full-width layers, the passes
#     graphed and eager (session 39's), in turn; requests with logprobs 5, the drawn rows' log-probabilities
#     together and a row at a time.
#     BUDGET=560 bash bench/gpu_session40_call.sh      (STEPS=23: only the benches; TESTS_K narrows step 1)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s40-out}
mkdir -p "$OUT" /tmp/s40-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
STEPS=${STEPS:-123}
. bench/run_steps.sh
T=/tmp/s40-steps
rm -f "$T"/*

machine
rm -rf /tmp/pylib
wheels fla_core einops
want 1 && step "1. sampling on the GPU, graphed, and the paths that sample there" 240 "$T/a_tests.txt" python -m pytest \
    -q -p no:cacheprovider --durations=8 tests/gpu/test_sampling_gpu.py tests/gpu/test_drafts_gpu.py \
    tests/gpu/test_mtp_gpu.py tests/gpu/test_structured_gpu.py tests/gpu/test_reuse_gpu.py ${TESTS_K:+-k "$TESTS_K"}
want 2 && step "2. sampling_bench on the GPU" 90 "$T/b_sampling.txt" python bench/sampling_bench.py --device cuda \
    --calls 30 --first-form --out "$T/sampling_gpu.json"
want 3 && step "3. decode through the scheduler" 240 "$T/c_served.txt" python bench/served_decode_bench.py \
    --layers KKKD --lanes 1,4,16 --tokens 96 --repeats 2 --eager-draws --logprobs 5 --out "$T/served_decode.json"
collect "$T" "$OUT/benches.json"
