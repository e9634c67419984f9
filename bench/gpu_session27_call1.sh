#!/usr/bin/env bash
# Session 27's first call, <= BUDGET s (run at the uncommitted AHEAD form, then reverted: every fetched-ahead form
# lost in the sweep): the dense decode kernel's groups fetched ahead (issue 19; AHEAD, loop-carried
# loads of the next one or two groups' bytes and scales) — tests/gpu/test_dense_gpu.py (every launch form against the
# exact product, ahead ≡ plain in bits), the launch sweep with the new forms (four real shapes, q4 and fp8, 1 and 8
# rows, 20 calls a graph over copies that miss L2), then the products' table with the launch table as it stands.
#     BUDGET=560 bash bench/gpu_session27_call1.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s27a-out}
mkdir -p "$OUT" /tmp/s27a-steps
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-560}
. bench/run_steps.sh
T=/tmp/s27a-steps

machine
wheels fla_core einops
step "1. tests/gpu/test_dense_gpu.py" 100 "$OUT/dense_gpu_tests.txt" \
    python -m pytest -q -p no:cacheprovider tests/gpu/test_dense_gpu.py
step "2. launch sweep" 330 "$T/sweep.txt" python bench/dense_bench.py --sweep --out "$T/dense_sweep.json"
step "3. dense products, 20 calls a graph" 90 "$T/dense20.txt" \
    python bench/dense_bench.py --tp 1 --calls 20 --out "$T/dense_products_calls20.json"
collect "$T" "$OUT/benches.json"
