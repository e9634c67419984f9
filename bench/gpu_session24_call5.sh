#!/usr/bin/env bash
# Session 24's fifth call, <= BUDGET s: DSA's absorbed kv_b kept as the bf16 the loader reads (half the bytes a
# decode step reads of it; the same values, so the same products) — the GPU tests through its paths (drafted ≡
# serial, CUDA parity, the row-invariant products, the prompt forms), then at the released depth this tree against
# the same tree with kv_b made fp32 again (a sed of one line, in a copy under /tmp): the step that may verify and its
# window of 4 (bf16 dense), and the graphed q4 decode step.
#     BUDGET=400 bash bench/gpu_session24_call5.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s24e-out}
mkdir -p "$OUT" /tmp/s24e-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-400}
. bench/run_steps.sh
T=/tmp/s24e-steps
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
rm -rf /tmp/fp32kvb && mkdir -p /tmp/fp32kvb && cp -r engine bench /tmp/fp32kvb/
sed -i 's/kv_b = kv_b if kv_b.dtype == torch.bfloat16 else kv_b.float()/kv_b = kv_b.float()/' \
    /tmp/fp32kvb/engine/models/glm5_next/dsa.py
grep -c "kv_b = kv_b.float()" /tmp/fp32kvb/engine/models/glm5_next/dsa.py | tee -a "$LOG"
F="env PYTHONPATH=/tmp/pylib:/tmp/fp32kvb:/tmp/fp32kvb/bench"
step "1. GPU tests" 160 "$OUT/gpu_tests.txt" \
    python -m pytest -q tests/gpu/test_drafts_gpu.py tests/gpu/test_cuda_parity.py tests/gpu/test_rows_gpu.py \
    tests/gpu/test_prompt_forms_gpu.py
step "2. released depth, verify window 4: bf16 kv_b" 45 "$T/rows45_bf16.txt" \
    python bench/row_invariance_cost.py $R --out "$T/rows45_bf16.json"
step "3. released depth, verify window 4: fp32 kv_b" 45 "$T/rows45_fp32.txt" \
    $F python /tmp/fp32kvb/bench/row_invariance_cost.py $R --out "$T/rows45_fp32.json"
step "4. released depth decode, q4: bf16 kv_b" 40 "$T/decode_bf16.txt" \
    python bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill --out "$T/decode45_q4_bf16.json"
step "5. released depth decode, q4: fp32 kv_b" 40 "$T/decode_fp32.txt" \
    $F python /tmp/fp32kvb/bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill \
    --out "$T/decode45_q4_fp32.json"
collect "$T" "$OUT/benches.json"
