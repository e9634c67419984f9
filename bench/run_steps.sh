# Sourced by the device-call scripts (bench/gpu_*_run.sh) after they set OUT and BUDGET: the run's clock, its log
# ($OUT/run.log) and each step's time limit.
START=$(date +%s)
LOG="$OUT/run.log"
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
say() { echo "$*" | tee -a "$LOG"; }
# want N: whether step N is among those STEPS names (a script sets STEPS, e.g. STEPS=${STEPS:-123})
want() { [[ $STEPS == *$1* ]]; }
# cap NAME SECONDS: the seconds this step may take (its own cap or what is left), 0 when it must be skipped
cap() {
    local want=$2 rest; rest=$(left)
    if (( rest < 15 )); then echo "## $1: skipped, ${rest} s left of ${BUDGET}" | tee -a "$LOG" >&2; echo 0; return; fi
    (( want < rest )) && echo "$want" || echo "$rest"
}
# machine: the GPU (name, driver) into the log
machine() {
    say "## machine ($(date -u +%FT%TZ))"
    timeout 20 nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
}
# wheels [SKIP...]: every package .wheels carries (the lent machine has no network) but those named, into /tmp/pylib
# (on PYTHONPATH); e.g. `wheels fla_core einops` leaves fla-core out (no first-start autotune)
wheels() {
    local names skip; names=$(cd .wheels && ls *.whl | sed 's/-[0-9].*//' | sort -u)
    for skip in "$@"; do names=$(echo "$names" | grep -v -x "$skip"); done
    python -m pip install -q --no-deps --no-index --find-links .wheels --target /tmp/pylib $names > "$OUT/pip.log" 2>&1
    say "pip exit $?"
}
# fla_aside: fla-core (and einops) into /tmp/pylib-fla, for the steps run through $FLA (the others keep fla-core out),
# and the fla-core autotune choices an earlier call brought back as .wheels/autotune.tgz into TRITON_CACHE_DIR (no
# first-start autotune; `autotune_back` writes them for the next call)
fla_aside() {
    python -m pip install -q --no-deps --no-index --find-links .wheels --target /tmp/pylib-fla fla_core einops \
        >> "$OUT/pip.log" 2>&1
    FLA="env PYTHONPATH=/tmp/pylib-fla:$PYTHONPATH"
    export TRITON_CACHE_DIR=/tmp/tcache
    mkdir -p /tmp/tcache
    [ -f .wheels/autotune.tgz ] && tar xzf .wheels/autotune.tgz -C /tmp/tcache
    return 0
}
autotune_back() { (cd /tmp/tcache && find . -name '*.autotune.json' | tar czf "$OUT/autotune.tgz" -T -); }
# prev_tree: PREV's engine (.wheels/prev/tree-$PREV.tgz, bench/fetch_wheels.sh) with this checkout's bench into
# OLD=/tmp/prev-$PREV, for the steps that time the tree before (gpu_engine.py puts its own checkout first on sys.path)
prev_tree() {
    OLD=/tmp/prev-$PREV
    rm -rf "$OLD"
    mkdir -p "$OLD"
    tar xzf ".wheels/prev/tree-$PREV.tgz" -C "$OLD"
    cp -r bench "$OLD/"
}
# step NAME SECONDS FILE COMMAND...: COMMAND under its cap, its output in FILE; the exit and a summary in the log
step() {
    local name=$1 want=$2 file=$3 t; shift 3
    t=$(cap "$name" "$want")
    (( t > 0 )) || return 0
    say "## $name (timeout $t s)"
    timeout -s INT -k 10 "$t" "$@" > "$file" 2>&1
    say "exit $? after $(( $(date +%s) - START )) s"
    { grep -E "passed|failed|Error|assert" "$file" || tail -8 "$file"; } | tail -25 >> "$LOG"
}
# collect STEPS JSON: every step's JSON under STEPS merged into JSON (keyed by file stem), every step's output
# into $OUT/steps.txt, and the run's end into the log (a device call brings back at most 8 files)
collect() {
    python - "$1" "$2" <<'PY'
import json, pathlib, sys
found = {}
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    found[f.stem] = json.loads(f.read_text())
json.dump(found, open(sys.argv[2], "w"), indent=1)
PY
    cat "$1"/*.txt > "$OUT/steps.txt" 2>/dev/null
    say "## done after $(( $(date +%s) - START )) s"
}
# dense_steps STEPS_DIR PREV OLD LABEL [MODE]: the dense sessions' decode step — the 4-layer cut's step with MODE
# (default q4) dense weights (graphs, b1-b4) with OLD's engine (PREV's tree, unpacked) and then this tree's, into
# STEPS_DIR/MODE_before.json and STEPS_DIR/MODE_LABEL.json (sessions 46 and 48 ran it as q4_steps, into
# step_before.json and step_LABEL.json)
dense_steps() {
    local mode=${5:-q4}
    local E="python bench/gpu_engine.py --dense $mode --modes graphs --tp2 off --no-prefill"
    step "4-layer $mode decode $2" 60 "$1/${mode}_before.txt" env PYTHONPATH="/tmp/pylib:$3/bench" \
        ${E/bench/$3/bench} --out "$1/${mode}_before.json"
    step "4-layer $mode decode $4" 60 "$1/${mode}_$4.txt" $E --out "$1/${mode}_$4.json"
}
