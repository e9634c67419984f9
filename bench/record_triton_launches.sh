#!/usr/bin/env bash
# On the lent GPU: run the GPU tests that launch every engine Triton kernel with SPARKS_RECORD_TRITON set
# (tests/gpu/conftest.py), writing what was compiled to $OUT/triton_launches.json; copy it to
# tests/fixtures/triton_launches.json (tests/engine/test_gb10_compile.py compiles each entry for sm_121).
# The caller's PYTHONPATH comes first (the device scripts' /tmp/pylib holds the wheels the tests import). The tests
# run in WORKERS pytest-xdist processes (default 4); each writes its part and the parts are merged here. The tests'
# output goes to $OUT/record_tests.txt (what failed, with short tracebacks).
#     OUT=... bash bench/record_triton_launches.sh
# For a change to a few kernels: with TESTS (pytest node ids) only those run, and the kernels named in KERNELS take
# this run's entries in place of their committed ones (tests/fixtures/triton_launches.json); every other kernel keeps
# its committed entries (and gains any new specialisation this run compiled). It merges only after a clean run (every
# test passed or skipped) and names the committed specialisations of those kernels this run did not compile.
#     OUT=... TESTS="tests/gpu/test_prompt_forms_gpu.py ..." KERNELS="_attend_prompt" bash bench/record_triton_launches.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/record-out}
mkdir -p "$OUT"
RECORD="$OUT/triton_launches.json"
rm -f "$RECORD" "$RECORD".*
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}.:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
export SPARKS_RECORD_TRITON="$RECORD"
ALL="tests/gpu/test_cuda_parity.py tests/gpu/test_exl3_moe_gpu.py tests/gpu/test_drafts_gpu.py \
    tests/gpu/test_dense_gpu.py tests/gpu/test_rows_gpu.py tests/gpu/test_pool_keys_gpu.py \
    tests/gpu/test_exl3_gpu.py::test_forward_matches_the_reference \
    tests/gpu/test_exl3_gpu.py::test_prompt_chunk_path \
    tests/gpu/test_prompt_forms_gpu.py::test_prompt_attention_on_tensor_cores_matches_fp32 \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_at_the_served_widths \
    tests/gpu/test_prompt_forms_gpu.py::test_the_selected_token_kernel_reads_the_pools_latents_in_place \
    tests/gpu/test_prompt_forms_gpu.py::test_causal_conv_matches_cudnn_in_fp32 \
    tests/gpu/test_prompt_forms_gpu.py::test_the_conv_with_the_qk_norms_at_the_served_width \
    tests/gpu/test_prompt_forms_gpu.py::test_the_gated_norm_at_the_served_width \
    tests/gpu/test_moe_prompt_gpu.py"
# shellcheck disable=SC2086  # the lists are whitespace-separated node ids
timeout -s INT -k 10 "${LIMIT:-400}" python -m pytest -q -rfE --tb=short -p no:cacheprovider -n "${WORKERS:-4}" \
    --dist loadfile ${TESTS:-$ALL} > "$OUT/record_tests.txt" 2>&1
status=$?
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/record_tests.txt" | tail -25
if [ -n "${TESTS:-}" ] && [ "$status" -ne 0 ]; then  # a partial record replaces committed entries: only from a clean run
    echo "partial record not merged: the tests exited $status (failed, errored or timed out; $OUT/record_tests.txt)"
    exit 1
fi
python - "$RECORD" "${TESTS:+tests/fixtures/triton_launches.json}" "${KERNELS:-}" <<'PY'
import collections, glob, json, os, sys
record, kept, replaced = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
parts = [p for p in [record, *sorted(glob.glob(record + ".*"))] if os.path.exists(p)]
merged = {}
for part in parts:
    for entry in json.load(open(part)):
        merged.setdefault(json.dumps(entry, sort_keys=True), entry)
if kept:  # a partial record: the kernels not in KERNELS keep their committed entries
    dropped = collections.Counter()
    for entry in json.load(open(kept)):
        if entry["kernel"] not in replaced:
            merged.setdefault(json.dumps(entry, sort_keys=True), entry)
        elif json.dumps(entry, sort_keys=True) not in merged:
            dropped[entry["kernel"]] += 1
    if dropped:  # a committed specialisation of a replaced kernel this run did not compile (or compiles otherwise now)
        print("committed specialisations not compiled this run, dropped:", dict(dropped))
    missing = replaced - {e["kernel"] for e in merged.values()}
    assert not missing, f"KERNELS not compiled by TESTS: {sorted(missing)}"
entries = sorted(merged.values(), key=lambda e: (e["module"], e["kernel"], json.dumps(e, sort_keys=True)))
json.dump(entries, open(record, "w"), indent=1)
for part in parts[1:]:
    os.remove(part)
print(len(entries), "compiled specialisations from", len(parts), "parts:", dict(collections.Counter(e["kernel"] for e in entries)))
PY
