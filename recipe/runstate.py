"""What is running: the state file a launch writes (LOG_DIR/run/state.json) and checks on the ranks it names.

A process rank is recorded with its node, its PID *and* its start time from /proc (a PID alone can be reused by an
unrelated program after ours exits); it counts as ours only while both match. A container rank is recorded by its
container id, which is never reused, and is alive while `docker inspect` says it runs. A worker's ranks are looked up
over ssh, one command per node; a node that does not answer leaves its ranks unknown (None), never "exited".
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from recipe.nodes import node_for

STATE_FILE = "state.json"


def rank_ident(container: str, pid: int) -> str:
    """How a person finds a rank on its node: its container (short id) or its process."""
    return f"container {container[:12]}" if container else f"pid {pid}"


@dataclass(frozen=True)
class RankProcess:
    rank: int
    pid: int
    start_ticks: int   # field 22 of /proc/PID/stat: when the process started, in clock ticks since boot
    log: str           # on its node
    node: str = "local"   # "local" or the worker's ssh target
    container: str = ""   # the container id when the rank runs in Docker (pid and start_ticks are then 0)

    @property
    def where(self) -> str:
        return "here" if self.node == "local" else f"on {self.node}"

    @property
    def ident(self) -> str:
        """How a person finds this rank on its node."""
        return rank_ident(self.container, self.pid)


@dataclass(frozen=True)
class RankStop:
    """How stopping one rank went (any runtime, any node)."""
    rank: int
    pid: int
    outcome: str             # "stopped" | "killed" | "was not running" | "unknown: <why>" (worker not reached)
    saved_log: Path | None
    node: str = "local"
    container: str = ""

    @property
    def ident(self) -> str:
        return rank_ident(self.container, self.pid)


@dataclass(frozen=True)
class RunState:
    runtime: str
    served_name: str
    api_url: str
    health_url: str
    started_at: float
    ranks: tuple[RankProcess, ...]

    def alive(self) -> dict[int, bool | None]:
        """Per rank: True while it runs, False once it exited, None when its node does not answer."""
        found: dict[int, bool | None] = {}
        for node in dict.fromkeys(r.node for r in self.ranks):
            found.update(ranks_alive([r for r in self.ranks if r.node == node]))
        return {r.rank: found[r.rank] for r in self.ranks}

    @property
    def all_alive(self) -> bool:
        return all(v is True for v in self.alive().values())

    @property
    def any_alive(self) -> bool:
        return any(v is not False for v in self.alive().values())

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.node for r in self.ranks))


def start_ticks(pid: int) -> int | None:
    """The process's start time from /proc, or None when there is no such (live) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name in (...) may hold spaces
    if fields[0] == "Z":
        _reap(pid)
        return None
    return int(fields[19])


def _reap(pid: int) -> None:
    """Collect a finished child of this process (tests start ranks in-process), so it stops being a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def is_alive(pid: int, ticks: int) -> bool:
    return start_ticks(pid) == ticks


# `ticks PID` prints a live process's start time (field 22 of /proc/PID/stat; a zombie counts as gone). The command
# name in (...) may hold spaces, so fields are counted after the last ") ".
TICKS_SH = ('ticks() { s=$(cat /proc/$1/stat 2>/dev/null) || return 1; s=${s##*") "}; set -- $s; '
            '[ "$1" != Z ] || return 1; shift 19; echo "$1"; }')
PROBE_TIMEOUT_S = 20


def ranks_alive(ranks: list[RankProcess]) -> dict[int, bool | None]:
    """Liveness of ranks that share one node: /proc here, one ssh command for a worker."""
    if not ranks:
        return {}
    if ranks[0].container:
        return containers_alive(ranks)
    if ranks[0].node == "local":
        return {r.rank: is_alive(r.pid, r.start_ticks) for r in ranks}
    script = TICKS_SH + '; for p in "$@"; do echo "$p $(ticks $p || echo -)"; done'
    result = node_for(ranks[0].node).run(["sh", "-c", script, "alive", *(str(r.pid) for r in ranks)],
                                         timeout_s=PROBE_TIMEOUT_S)
    if not result.ok:
        return {r.rank: None for r in ranks}
    seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    return {r.rank: seen.get(str(r.pid)) == str(r.start_ticks) for r in ranks}


# Arguments: container ids. Prints "ID running|exited|gone" per container; exit 3 when docker does not answer.
_INSPECT_SH = r'''
docker info >/dev/null 2>&1 || { echo "docker does not answer" >&2; exit 3; }
for c in "$@"; do
  s=$(docker inspect -f '{{.State.Running}}' "$c" 2>/dev/null) || s=gone
  case $s in true) s=running;; false) s=exited;; esac
  echo "$c $s"
done
'''


def containers_alive(ranks: list[RankProcess]) -> dict[int, bool | None]:
    """Liveness of container ranks on one node: one `docker inspect` per container, one command per node."""
    result = node_for(ranks[0].node).run(["sh", "-c", _INSPECT_SH, "inspect", *(r.container for r in ranks)],
                                         timeout_s=PROBE_TIMEOUT_S)
    if not result.ok:
        return {r.rank: None for r in ranks}
    seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    return {r.rank: seen.get(r.container) == "running" if r.container in seen else None for r in ranks}


def save_state(run_dir: Path, state: RunState) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    data = asdict(state)
    tmp = run_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(run_dir / STATE_FILE)


def load_state(run_dir: Path) -> RunState | None:
    path = run_dir / STATE_FILE
    try:
        data = json.loads(path.read_text())
        ranks = tuple(RankProcess(**r) for r in data.pop("ranks"))
        return RunState(**data, ranks=ranks)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def clear_state(run_dir: Path) -> None:
    (run_dir / STATE_FILE).unlink(missing_ok=True)
