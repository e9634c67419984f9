#!/usr/bin/env bash
# Session 26's fourth call, <= BUDGET s: the hyper-connection kernels' launches recorded (`_hc_post` took the next
# map's sums: tests/fixtures/triton_launches.json's entries for it are replaced from this record, for the sm_121
# compile test); issue 18's figure on its own config — verify windows 1..5 against the plain step on the 4-layer
# full-width bf16 model with its MTP layer (every window MTP-drafted); then tests/gpu but test_exl3_gpu.py
# (untouched since call 1) on the final tree (drafts' usage counts, format drafts, chained hyper-connections).
#     BUDGET=560 bash bench/gpu_session26_call4.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s26d-out}
mkdir -p "$OUT" /tmp/s26d-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh
T=/tmp/s26d-steps

machine
wheels fla_core einops
step "0. record the hyper-connection launches" 90 "$T/record.txt" \
    env SPARKS_RECORD_TRITON="$OUT/hc_launches.json" python -m pytest -q -p no:cacheprovider \
    tests/gpu/test_rows_gpu.py::test_hyper_connection_kernels_at_the_served_width \
    tests/gpu/test_cuda_parity.py::test_chained_hyper_connections_give_the_unchained_bits
step "1. verify windows, 4 layers + MTP" 120 "$T/verify_kkkd.txt" \
    python bench/verify_bench.py --layers KKKD --mtp --out "$T/verify_kkkd_mtp.json"
step "2. tests/gpu but test_exl3_gpu.py, -n 8 --dist loadfile" 260 "$OUT/gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider -n 8 --dist loadfile --durations=10 tests/gpu \
    --ignore=tests/gpu/test_exl3_gpu.py
collect "$T" "$OUT/benches.json"
