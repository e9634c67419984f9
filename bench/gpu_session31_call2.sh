#!/usr/bin/env bash
# Session 31's second device call (after bench/gpu_session31_call1.sh), <= BUDGET s: the released depth's prompts of
# 32k / 128k / 256k tokens with fla-core (rank 0's TP=2 share, q4 dense, EXL3 experts; session 30: 5,045 / 4,227 /
# 3,716 tok/s; the reference's two Sparks 1,979 / 1,838 / 1,642) and the batch-1 step after each (8.63 / 8.75 /
# 8.76 ms) with the split bf16 indexer (128 pools a program on Hopper since session 32, and a 32k or 128k chunk's
# pool choice by top_pools' kernel) and the step's latents read in place, then the same from a copy of the tree
# whose prompt chunks score fp32 keys again (tf32x3: `SparseMLA._select` reads the pool keys as before session 31)
# and whose steps gather the latents into fp32 first (`decode_lanes`), the script's two seds, in one call so the two
# share a machine.
#     BUDGET=590 bash bench/gpu_session31_call2.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s31b-out}
mkdir -p "$OUT" /tmp/s31b-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-590}
. bench/run_steps.sh
T=/tmp/s31b-steps

machine
wheels fla_core einops
fla_aside
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r engine bench /tmp/before/
sed -i 's|keys = ops.PoolKeys(pool, self.pool_layer, slice(self.rank_dim, self.key_end), self._pool_ends(slots)\[None\])|keys = pool.read(self.pool_layer, self._pool_ends(slots), columns=slice(self.rank_dim, self.key_end))[None]|' \
    /tmp/before/engine/models/glm5_next/dsa.py
sed -i 's|latents = ops.PoolColumns(pool, self.pool_layer, slice(0, self.rank_dim), slots)  # \[B, N, r\], read in place|latents = pool.read(self.pool_layer, slots, columns=slice(0, self.rank_dim))  # [B, N, r]|' \
    /tmp/before/engine/models/glm5_next/dsa.py
grep -c "pool.read(self.pool_layer, self._pool_ends(slots)\|pool.read(self.pool_layer, slots, columns" \
    /tmp/before/engine/models/glm5_next/dsa.py | tee -a "$LOG"
step "1. released q4, split bf16 indexer: prompts of 8k (warm-up) / 32k / 128k / 256k" 270 "$T/long.txt" $FLA python \
    bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none --tp2 off --no-prefill \
    --long-contexts 8192,32768,131072,262144 --out "$T/long_context_released_q4_split.json"
step "2. the same, before: prompt chunks' indexer on fp32 keys (tf32x3), steps' latents gathered" 270 "$T/long_before.txt" \
    env PYTHONPATH=/tmp/pylib-fla:/tmp/pylib:/tmp/before:/tmp/before/bench:tests/engine:tests/gpu:tests \
    python /tmp/before/bench/gpu_engine.py --layers released --exl3-experts --shard 2 --dense q4 --modes none \
    --tp2 off --no-prefill --long-contexts 8192,32768,131072,262144 --out "$T/long_context_released_q4_tf32x3.json"
collect "$T" "$OUT/benches.json"
