# Sourced by the device-call scripts (bench/gpu_*_run.sh) after they set OUT and BUDGET: the run's clock, its log
# ($OUT/run.log) and each step's time limit.
START=$(date +%s)
LOG="$OUT/run.log"
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
say() { echo "$*" | tee -a "$LOG"; }
# cap NAME SECONDS: the seconds this step may take (its own cap or what is left), 0 when it must be skipped
cap() {
    local want=$2 rest; rest=$(left)
    if (( rest < 15 )); then echo "## $1: skipped, ${rest} s left of ${BUDGET}" | tee -a "$LOG" >&2; echo 0; return; fi
    (( want < rest )) && echo "$want" || echo "$rest"
}
