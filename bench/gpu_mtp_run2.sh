#!/usr/bin/env bash
# Second call on the lent one-GPU machine for MTP drafts and the grouped-GEMM prompt MoE (session 9), ≤ BUDGET s.
# fla-core is left out (its first-start autotune would take ~160 s; the suite's results do not depend on it):
#     BUDGET=580 bash bench/gpu_mtp_run2.sh
#   1. tests/gpu: MTP drafts with graphs on the regenerated trained demo, the grouped-GEMM prompt MoE, the copy-draft
#      scheduler and rejection checks, graphs, prompt reuse with MTP drafts                  -> gpu_tests.txt
#   2. bench/gpu_engine.py --modes none: prefill 2k/8k/32k, grouped GEMM then the loop      -> prefill_*.json
#   3. bench/verify_bench.py --mtp: MTP-drafted steps against the plain step                 -> verify_mtp.json
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtp-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/pylib:.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-580}
. bench/run_steps.sh

machine
wheels fla_core einops
step "1. tests/gpu" 330 "$OUT/gpu_tests.txt" \
    python -m pytest -q -rs -p no:cacheprovider tests/gpu/test_mtp_gpu.py tests/gpu/test_moe_prompt_gpu.py \
    tests/gpu/test_graphs.py tests/gpu/test_reuse_gpu.py tests/gpu/test_drafts_gpu.py -k "not full_width and not exl3"
step "2a. prefill, grouped GEMM" 70 "$OUT/prefill_grouped.txt" \
    python bench/gpu_engine.py --modes none --out "$OUT/prefill_grouped.json"
step "2b. prefill, loop over experts" 70 "$OUT/prefill_loop.txt" \
    python bench/gpu_engine.py --modes none --moe-loop --out "$OUT/prefill_loop.json"
step "3. bench/verify_bench.py --mtp" 120 "$OUT/verify_mtp.txt" \
    python bench/verify_bench.py --mtp --out "$OUT/verify_mtp.json"
say "## done after $(( $(date +%s) - START )) s"
