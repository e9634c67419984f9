#!/usr/bin/env bash
# On the lent H200 machine (one call, ~5 min): the graph-decode GPU tests, the engine benchmark with graphs on and
# off, then the rest of tests/gpu. Logs and JSON under $OUT; each step bounded so a slow one leaves time to the next.
set -u -o pipefail
export PYTHONPATH=.:tests/engine PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
    | tee -a "$OUT/gpu.txt"
timeout 90 python -m pytest -q -p no:cacheprovider -rs tests/gpu/test_graphs.py tests/gpu/test_cuda_parity.py 2>&1 \
    | tee "$OUT/tests_graphs.log" | tail -30
python -m engine make-demo /tmp/small --size small >/dev/null
timeout 170 python bench/gpu_engine.py --small /tmp/small --out "$OUT/gpu_engine.json" 2>&1 \
    | tee "$OUT/bench.log" | grep -v '^ ' | tail -30
others=$(ls tests/gpu/test_*.py | grep -v -e test_graphs.py -e test_cuda_parity.py)
timeout 50 python -m pytest -q -p no:cacheprovider $others 2>&1 | tee "$OUT/tests_other.log" | tail -8
