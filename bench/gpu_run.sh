#!/usr/bin/env bash
# On the lent H200 machine: GPU tests, then the engine benchmark (results under $OUT).
set -u
export PYTHONPATH=.:tests/engine
python -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -4
python -m engine make-demo /tmp/small --size small >/dev/null
timeout 420 python bench/gpu_engine.py --small /tmp/small --out "$OUT/gpu_engine.json" 2>&1 | tail -45
