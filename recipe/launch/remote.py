"""Ranks on workers as plain processes, over ssh: start one detached, stop a node's ranks, read a rank's log.

Everything runs as POSIX sh on the worker through the node's one shared ssh connection, so the worker needs
nothing of ours but the engine's Python environment at the plan's path (on real Sparks, the Docker runtime carries
the environment instead). A rank starts in its own session (`setsid`, which execs in place, so `$!` is the rank's
PID and its process group), with output to its log on the worker; ssh returns at once because the rank holds none
of the session's descriptors. Nothing here prints.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from recipe.errors import RecipeError
from recipe.launch.logs import save_log_data
from recipe.launch.runstate import TICKS_SH, RankProcess, RankStop
from recipe.net.nodes import Node
from recipe.plan.parts import RankPlan

SPAWN_TIMEOUT_S = 30
TAIL_BYTES = 256 << 10

_SPAWN_SH = (
    TICKS_SH
    + r"""
log=$1; shift
mkdir -p "$(dirname "$log")" && cd / || exit 1
setsid "$@" >"$log" 2>&1 </dev/null &
pid=$!
t=$(ticks $pid) && sleep 0.2 && [ "$(ticks $pid)" = "$t" ] || {
  echo "the rank exited at once; its log: $log" >&2; tail -n 5 "$log" >&2; exit 1; }
echo "$pid $t"
"""
)

# Arguments: the timeout in seconds, then PID:TICKS of each rank. Prints "PID:TICKS signalled|gone|killed" lines.
_STOP_SH = (
    TICKS_SH
    + r"""
T=$1; shift
ours() { [ "$(ticks "${1%%:*}")" = "${1#*:}" ]; }
for e in "$@"; do
  p=${e%%:*}
  if ours "$e"; then kill -TERM -$p 2>/dev/null || kill -TERM $p; echo "$e signalled"; else echo "$e gone"; fi
done
n=0
while [ $n -lt $((T * 10)) ]; do
  left=0
  for e in "$@"; do ours "$e" && left=1; done
  [ $left = 0 ] && break
  sleep 0.1; n=$((n + 1))
done
for e in "$@"; do
  p=${e%%:*}
  if ours "$e"; then kill -KILL -$p 2>/dev/null || kill -KILL $p; echo "$e killed"; fi
done
"""
)


class RemoteError(RecipeError):
    """A worker could not be reached, or a rank could not be started or stopped there."""


def spawn(node: Node, rank: RankPlan) -> RankProcess:
    """Start one rank on `node` in its own session; returns its PID and start time there."""
    env = [f"{name}={value}" for name, value in rank.env.items()]
    result = node.run(["sh", "-c", _SPAWN_SH, "spawn", rank.log, "env", *env, *rank.argv], timeout_s=SPAWN_TIMEOUT_S)
    words = result.stdout.split()
    if not result.ok or len(words) != 2 or not all(w.isdigit() for w in words):
        raise RemoteError(
            f"could not start rank {rank.rank} on {node.name}: {result.last_error_line()}",
            node.fix_for(result)
            if result.code == 255
            else f"run it by hand to see why: ssh {node.name} {shlex.join(rank.argv[:4])} ...",
        )
    return RankProcess(rank.rank, int(words[0]), int(words[1]), rank.log, node.name)


def stop_ranks(node: Node, ranks: list[RankProcess], timeout_s: float, log_dir: Path, keep: int) -> list[RankStop]:
    """SIGTERM each rank's process group on `node`, wait up to `timeout_s`, SIGKILL what is left; then bring each
    rank's log here (LOG_DIR, gzipped, rotated) and remove it there."""
    pairs = [f"{r.pid}:{r.start_ticks}" for r in ranks]
    result = node.run(["sh", "-c", _STOP_SH, "stop", str(int(timeout_s)), *pairs], timeout_s=timeout_s + 30)
    if not result.ok:
        why = f"unknown: {result.last_error_line()}"
        return [RankStop(r.rank, r.pid, why, None, r.node) for r in ranks]
    said: dict[str, str] = {}
    for line in result.stdout.splitlines():
        pair, _, word = line.partition(" ")
        said[pair] = "killed" if word == "killed" or said.get(pair) == "killed" else word
    outcome = {"signalled": "stopped", "killed": "killed", "gone": "was not running"}
    return [
        RankStop(
            r.rank,
            r.pid,
            outcome.get(said.get(f"{r.pid}:{r.start_ticks}", ""), "unknown"),
            fetch_log(node, r, log_dir, keep),
            r.node,
        )
        for r in ranks
    ]


def fetch_log(node: Node, rank: RankProcess, log_dir: Path, keep: int) -> Path | None:
    """Copy a worker rank's log into LOG_DIR here (like a local rank's), then remove it on the worker."""
    data = node.fetch(["cat", rank.log])
    if data is None:
        return None
    saved = save_log_data(data, log_dir, rank.rank, keep)
    node.run(["rm", "-f", rank.log], timeout_s=SPAWN_TIMEOUT_S)
    return saved


def tail(node: Node, path: str, count: int = 25) -> list[str]:
    """The last lines of a log on a worker; one line saying why when it cannot be read."""
    data = node.fetch(["tail", "-c", str(TAIL_BYTES), path], timeout_s=SPAWN_TIMEOUT_S)
    if data is None:
        return [f"(could not read {path} on {node.name})"]
    return [line.decode(errors="replace") for line in data.splitlines()[-count:]]
