#!/usr/bin/env bash
# Session 33's first device call (any GPU), <= BUDGET s:
# 1. the GPU tests session 32 mended without a GPU (the fp8 indexer's step against a chunk's copy, now widened to
#    fp32 before bf16; the lane attention's fp8 latents in place, now compiled without FMA contraction; every e4m3
#    value converted to bf16 in a kernel against torch) and the pool choice's tests (test_pool_keys_gpu.py: top_pools'
#    kernels now cut a query's span into segments, eagerly and from a graph);
# 2. the choice alone: the torch form against the segmented kernels and one segment a query, 1..2,048 queries at
#    32k..1M spans (which rows `TOP_POOLS_LAUNCH["rows"]` should send to the kernels);
# 3. one DSA layer's 2k chunk at 512k and 1M (blocks of 128 and 64 queries, SparseMLA.SELECT_SCORES) with the
#    choice as dispatched now (the torch form below 512 rows), then from a copy of the tree that sends every row
#    count to the kernels with 1,024 programs (the sed), and from it with blocks of 4x the scores (a second sed: the kernels hold no
#    [T, P] masks beside the scores, the torch form's 2-4x);
# 4. the same chunk with bf16 rows at 32k and 128k: the latents read in place, then from a copy of the tree whose
#    bf16 pools' latents go to the selected-token attention as a contiguous copy, as an fp8 pool's do (the sed).
#     BUDGET=400 bash bench/gpu_session33_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s33a-out}
mkdir -p "$OUT" /tmp/s33a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-400}
. bench/run_steps.sh
T=/tmp/s33a-steps

machine
wheels fla_core einops
step "1. the fp8 forms' bits, the e4m3 conversion, the pool choice's kernels" 75 "$T/tests.txt" python -m pytest -q \
    -rfE --tb=short -p no:cacheprovider -n 3 "tests/gpu/test_rows_gpu.py::test_indexer_scores_at_the_served_shapes" \
    "tests/gpu/test_rows_gpu.py::test_lane_attention_reads_the_pools_latents_in_place" \
    "tests/gpu/test_rows_gpu.py::test_triton_converts_every_e4m3_value_to_bf16_as_torch_does" \
    tests/gpu/test_pool_keys_gpu.py
step "2. the choice alone: torch form, segmented kernels, one segment a query" 70 "$T/select.txt" python \
    bench/pool_keys_bench.py --select-rows 1,8,64,128,512,2048 --spans 32768,131072,524288,1048576 --repeats 20 \
    --out "$T/select_rows.json"
step "3a. a DSA layer's chunk at 512k and 1M, the choice as dispatched (torch below 512 rows)" 60 "$T/long_now.txt" \
    python bench/long_prompt_bench.py --spans 524288,1048576 --kv bf16 --profile --out "$T/long_prompt_now.json"
rm -rf /tmp/rows1 && mkdir -p /tmp/rows1 && cp -r engine bench /tmp/rows1/
sed -i 's|"programs": 512, "rows": 512}|"programs": 1024, "rows": 1}|' /tmp/rows1/engine/ops/triton_dsa.py
grep -c '"rows": 1}' /tmp/rows1/engine/ops/triton_dsa.py | tee -a "$LOG"
step "3b. the same, every row count to the kernels" 60 "$T/long_rows1.txt" python /tmp/rows1/bench/long_prompt_bench.py \
    --spans 524288,1048576 --kv bf16 --profile --out "$T/long_prompt_rows1.json"
sed -i 's|    SELECT_SCORES = 1 << 24|    SELECT_SCORES = 1 << 26|' /tmp/rows1/engine/models/glm5_next/dsa.py
grep -c 'SELECT_SCORES = 1 << 26' /tmp/rows1/engine/models/glm5_next/dsa.py | tee -a "$LOG"
step "3c. the same with 4x the scores a block (256 MiB: 512 queries at 512k, 256 at 1M)" 60 "$T/long_rows1_big.txt" \
    python /tmp/rows1/bench/long_prompt_bench.py --spans 524288,1048576 --kv bf16 --profile \
    --out "$T/long_prompt_rows1_blocks4x.json"
step "4a. a DSA layer's chunk, bf16 rows in place, 32k and 128k" 25 "$T/in_place.txt" python \
    bench/long_prompt_bench.py --spans 32768,131072 --kv bf16 --repeats 3 --out "$T/long_prompt_bf16_in_place.json"
rm -rf /tmp/copy33 && mkdir -p /tmp/copy33 && cp -r engine bench /tmp/copy33/
sed -i 's|        if self.pool.kv == "fp8" and fp8 and copy and self.shape\[0\] <= self.COPY_ROWS:|        if (self.pool.kv == "bf16" or (self.pool.kv == "fp8" and fp8)) and copy and self.shape[0] <= self.COPY_ROWS:|' \
    /tmp/copy33/engine/ops/reference.py
grep -c 'if (self.pool.kv == "bf16" or' /tmp/copy33/engine/ops/reference.py | tee -a "$LOG"
step "4b. the same, bf16 latents as a contiguous copy" 25 "$T/copy.txt" python /tmp/copy33/bench/long_prompt_bench.py \
    --spans 32768,131072 --kv bf16 --repeats 3 --out "$T/long_prompt_bf16_copy.json"
collect "$T" "$OUT/benches.json"
