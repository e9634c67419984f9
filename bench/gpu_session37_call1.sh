#!/usr/bin/env bash
# Session 37's first call (any GPU), <= BUDGET s:
#  1. the KDA prompt chunk's gated norm in one launch (`triton_kda._gated_norm`) recorded into the launch record
#     (record_triton_launches.sh's partial mode), with the GPU tests of the KDA prompt path (fla-core importable);
#  2. bench/fla_gate_bench.py: fla-core's bounded-gate forms (safe_gate, the gate in its kernel) at a KDA layer's
#     prompt chunk, time and error against fp64;
#  3. issue 20's 4-layer bf16 prefill (2k / 8k), this tree (KDA's and DSA's prompt projections in one product, the
#     gated norm in one launch) and 3c27829's (.wheels/prev/tree-3c27829.tgz), in turn; then copies of this tree with
#     the log-decay made in fla-core's kernel (fla_kda.GATE_IN_KERNEL), without and with its safe_gate form;
#  4. this tree's 2,048-token chunk ending at 8,192, every kernel.
#     BUDGET=570 bash bench/gpu_session37_call1.sh
# (.wheels/prev/tree-3c27829.tgz, if absent: git archive 3c27829 engine bench/gpu_engine.py bench/decode_trace.py
#  bench/exl3_prompt_bench.py config | gzip > .wheels/prev/tree-3c27829.tgz)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/s37a-out}
mkdir -p "$OUT" /tmp/s37a-steps /tmp/old /tmp/gate/bench /tmp/safe/bench
export PYTHONPATH=/tmp/pylib:.:bench:tests/engine:tests/gpu:tests PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-570}
. bench/run_steps.sh
T=/tmp/s37a-steps

machine
wheels fla_core einops
fla_aside
tar xzf .wheels/prev/tree-3c27829.tgz -C /tmp/old
for d in gate safe; do cp -r engine config /tmp/$d/ && cp bench/gpu_engine.py bench/exl3_prompt_bench.py /tmp/$d/bench/; done
sed -i 's/^GATE_IN_KERNEL = False/GATE_IN_KERNEL = True/' /tmp/gate/engine/ops/fla_kda.py /tmp/safe/engine/ops/fla_kda.py
sed -i 's/^SAFE_GATE = False/SAFE_GATE = True/' /tmp/safe/engine/ops/fla_kda.py
grep -c "^GATE_IN_KERNEL = True\|^SAFE_GATE = True" /tmp/gate/engine/ops/fla_kda.py /tmp/safe/engine/ops/fla_kda.py | tee -a "$LOG"
step "1. the KDA prompt tests, _gated_norm recorded" 140 "$T/record.txt" $FLA env OUT="$OUT" WORKERS=3 LIMIT=130 \
    KERNELS="_gated_norm" TESTS="tests/gpu/test_prompt_forms_gpu.py::test_the_gated_norm_at_the_served_width \
    tests/gpu/test_prompt_forms_gpu.py::test_the_conv_with_the_qk_norms_at_the_served_width \
    tests/gpu/test_kda_prompt_gpu.py tests/gpu/test_cuda_parity.py" bash bench/record_triton_launches.sh
step "2. fla-core's gate forms" 70 "$T/fla_gate.txt" $FLA python bench/fla_gate_bench.py --out "$T/fla_gate.json"
P="--layers KKKD --modes none --tp2 off --prefill-lengths 2048,8192"
step "3a. prefill, this tree" 100 "$T/pre_new_a.txt" $FLA python bench/gpu_engine.py $P --out "$T/pre_new_a.json"
step "3b. prefill, 3c27829" 60 "$T/pre_old.txt" env -C /tmp/old $FLA python bench/gpu_engine.py $P --out "$T/pre_old.json"
step "3c. prefill, the gate in fla-core" 60 "$T/pre_gate.txt" env -C /tmp/gate $FLA python bench/gpu_engine.py $P \
    --out "$T/pre_gate.json"
step "3d. prefill, the gate in fla-core, safe_gate" 60 "$T/pre_safe.txt" env -C /tmp/safe $FLA python \
    bench/gpu_engine.py $P --out "$T/pre_safe.json"
step "4. the 8k chunk traced" 60 "$T/trace_pre.txt" $FLA python bench/decode_trace.py --layers KKKD --prefill 8192 \
    --out "$OUT/trace_prefill_kkkd_bf16.json.gz"
collect "$T" "$OUT/benches.json"
