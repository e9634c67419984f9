#!/usr/bin/env bash
# Session 24's sixth call, <= BUDGET s: the MoE routers and the hyper-connections' maps kept as the bf16 the loader
# reads too (with DSA's kv_b, call 5) — the GPU tests through their paths, then at the released depth the step that
# may verify and its window of 4 (bf16 dense), the graphed q4 decode step against the same tree with all three made
# fp32 again (a sed of three lines, in a copy under /tmp) and with the tensor-core EXL3 GEMV at its committed launch;
# last the tensor-core GEMV's GPU cases no earlier call reached (mul1 at most widths; both forms through the MoE).
#     BUDGET=260 bash bench/gpu_session24_call6.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s24f-out}
mkdir -p "$OUT" /tmp/s24f-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-260}
. bench/run_steps.sh
T=/tmp/s24f-steps
R="--layers released --exl3-experts --shard 2"

machine
wheels fla_core einops
rm -rf /tmp/fp32w && mkdir -p /tmp/fp32w && cp -r engine bench /tmp/fp32w/
G=/tmp/fp32w/engine/models/glm5_next
sed -i 's/kv_b = kv_b if kv_b.dtype == torch.bfloat16 else kv_b.float()/kv_b = kv_b.float()/' $G/dsa.py
sed -i 's/self.router = router if router.dtype == torch.bfloat16 else router.float()/self.router = router.float()/' $G/moe.py
sed -i 's/self.fn = fn if fn.dtype == torch.bfloat16 else fn.float()/self.fn = fn.float()/' $G/mhc.py
cat $G/dsa.py $G/moe.py $G/mhc.py | grep -c "= kv_b.float()$\|= router.float()$\|= fn.float()$" | tee -a "$LOG"
F="env PYTHONPATH=/tmp/pylib:/tmp/fp32w:/tmp/fp32w/bench"
step "1. GPU tests" 110 "$OUT/gpu_tests.txt" \
    python -m pytest -q tests/gpu/test_drafts_gpu.py tests/gpu/test_cuda_parity.py tests/gpu/test_exl3_moe_gpu.py
step "2. released depth, verify window 4: bf16 kept" 35 "$T/rows45_bf16.txt" \
    python bench/row_invariance_cost.py $R --out "$T/rows45_bf16.json"
step "3. released depth decode, q4: bf16 kept" 30 "$T/decode_bf16.txt" \
    python bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill --out "$T/decode45_q4_bf16.json"
step "4. released depth decode, q4: fp32" 30 "$T/decode_fp32.txt" \
    $F python /tmp/fp32w/bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill \
    --out "$T/decode45_q4_fp32.json"
step "5. released depth decode, q4: bf16 kept, the tensor-core EXL3 GEMV" 30 "$T/decode_mma.txt" \
    python bench/gpu_engine.py $R --dense q4 --modes graphs --tp2 off --no-prefill --exl3-gemv mma \
    --out "$T/decode45_q4_bf16_mma.json"
step "6. the tensor-core GEMV's cases not run before" 60 "$T/gpu_tests_mma.txt" \
    python -m pytest -q tests/gpu/test_exl3_gpu.py -k "(mma and mul1) or both_forms or bank"
collect "$T" "$OUT/benches.json"
