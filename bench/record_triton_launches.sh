#!/usr/bin/env bash
# On the lent GPU: run the GPU tests that launch every engine Triton kernel with SPARKS_RECORD_TRITON set
# (tests/gpu/conftest.py), writing what was compiled to $OUT/triton_launches.json; copy it to
# tests/fixtures/triton_launches.json (tests/engine/test_gb10_compile.py compiles each entry for sm_121).
#     OUT=... bash bench/record_triton_launches.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/record-out}
mkdir -p "$OUT"
export PYTHONPATH=.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1 SPARKS_RECORD_TRITON="$OUT/triton_launches.json"
timeout -s INT -k 10 "${LIMIT:-400}" python -m pytest -q -p no:cacheprovider tests/gpu/test_cuda_parity.py \
    tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_drafts_gpu.py tests/gpu/test_dense_gpu.py tests/gpu/test_rows_gpu.py \
    "tests/gpu/test_exl3_gpu.py::test_forward_matches_the_reference" \
    "tests/gpu/test_exl3_gpu.py::test_prompt_chunk_path" \
    "tests/gpu/test_prompt_forms_gpu.py::test_prompt_attention_on_tensor_cores_matches_fp32" \
    "tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_at_the_served_widths" \
    "tests/gpu/test_prompt_forms_gpu.py::test_causal_conv_matches_cudnn_in_fp32" 2>&1 | tail -3
python - "$OUT/triton_launches.json" <<'PY'
import collections, json, sys
entries = json.load(open(sys.argv[1]))
print(len(entries), "compiled specialisations:", dict(collections.Counter(e["kernel"] for e in entries)))
PY
