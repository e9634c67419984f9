#!/usr/bin/env bash
# Session 31's first device call, written when no device was lent (run it in the next session that has one),
# <= BUDGET s: DSA's kernels as session 31 changed them by their instruction counts (docs/BENCHMARKS.md) — the
# indexer in the split bf16 form (q in three bf16 parts against keys stored as bf16 or e4m3), an fp8 pool's prompt
# latents as a bf16 copy, a step's latents read in place:
# 1. the GPU tests that launch them, recording the Triton launches again (the fixture's `_index_scores` and
#    `_attend_part` entries are derived by hand until then: copy $OUT/triton_launches.json over
#    tests/fixtures/triton_launches.json);
# 2. the indexer alone for fp32 keys (tf32x3: the prompt chunk's form before) and a bf16 and an fp8 pool's keys at
#    8k..128k under each launch variant (its float64 check at 512k would take ~50 GB of GPU memory);
# 3. one DSA layer's 2,048-query chunk at 32k..1M (session 30: 19 / 31 / 76 / 148 ms with bf16 rows, 30 / 43 / 89 /
#    161 with fp8);
# 4. the fp8 chunk at 32k and 128k from a copy of the tree whose fp8 latents are read in place (COPY_ROWS 0, the
#    script's sed): the before.
#     BUDGET=590 bash bench/gpu_session31_call1.sh    (then bench/gpu_session31_call2.sh: the released depth)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s31a-out}
mkdir -p "$OUT" /tmp/s31a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh
T=/tmp/s31a-steps

machine
wheels fla_core einops
step "1. record Triton launches (the GPU tests that launch every kernel, 6 workers)" 200 "$T/record.txt" \
    env OUT="$OUT" LIMIT=190 WORKERS=6 bash bench/record_triton_launches.sh
step "2. the indexer alone: fp32 keys / bf16 pool / fp8 pool, 8k..128k, launch variants" 150 "$T/index.txt" \
    python bench/dsa_prompt_bench.py --index --contexts 8192,32768,131072 --keys fp32,bf16,fp8 \
    --out "$T/dsa_index.json"
step "3. a DSA layer's 2k prompt chunk at 32k..1M spans" 150 "$T/long_prompt.txt" python bench/long_prompt_bench.py \
    --spans 32768,131072,524288,1048576 --kv bf16,fp8 --out "$T/long_prompt_bench.json"
rm -rf /tmp/before31 && mkdir -p /tmp/before31 && cp -r engine bench /tmp/before31/
sed -i 's|^    COPY_ROWS = 1 << 18$|    COPY_ROWS = 0|' /tmp/before31/engine/ops/reference.py
grep -c "COPY_ROWS = 0" /tmp/before31/engine/ops/reference.py | tee -a "$LOG"
step "4. the fp8 chunk at 32k and 128k, latents read in place (before)" 60 "$T/long_prompt_before.txt" \
    python /tmp/before31/bench/long_prompt_bench.py --spans 32768,131072 --kv fp8 \
    --out "$T/long_prompt_bench_fp8_in_place.json"
collect "$T" "$OUT/benches.json"
