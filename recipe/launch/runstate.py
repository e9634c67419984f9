"""What is running: the record a launch writes (LOG_DIR/run/state.json) and checks on the ranks it names.

The record is written atomically (a temporary file in the same folder, fsync, rename), and each rank also gets a
record of its own (LOG_DIR/run/rank<N>.json, the run's fields and that rank), written the same way as the rank
launches. When state.json cannot be read (cut short, corrupted, deleted), the ranks are read from those instead:
stop and status never take an unreadable record for "nothing is running".

A process rank is recorded with its node, its PID *and* its start time from /proc (a PID alone can be reused by an
unrelated program after ours exits); it counts as ours only while both match. A container rank is recorded by its
container id, which is never reused, and is alive while `docker inspect` says it runs. A worker's ranks are looked up
over ssh, one command per node; a node that does not answer leaves its ranks unknown (None), never "exited".
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from recipe.net.nodes import node_for

STATE_FILE = "state.json"
RANK_FILE = "rank{}.json"


def rank_ident(container: str, pid: int) -> str:
    """How a person finds a rank on its node: its container (short id) or its process."""
    return f"container {container[:12]}" if container else f"pid {pid}"


@dataclass(frozen=True)
class RankProcess:
    rank: int
    pid: int
    start_ticks: int  # field 22 of /proc/PID/stat: when the process started, in clock ticks since boot
    log: str  # on its node
    node: str = "local"  # "local" or the worker's ssh target
    container: str = ""  # the container id when the rank runs in Docker (pid and start_ticks are then 0)

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
    outcome: str  # "stopped" | "killed" | "was not running" | "unknown: <why>" (worker not reached)
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
    ports: tuple[int, ...] = ()  # what the ranks on the head listen on (PORT, MASTER_PORT)
    checkout: str = ""  # the checkout that started the run (its path)

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
TICKS_SH = (
    'ticks() { s=$(cat /proc/$1/stat 2>/dev/null) || return 1; s=${s##*") "}; set -- $s; '
    '[ "$1" != Z ] || return 1; shift 19; echo "$1"; }'
)
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
    result = node_for(ranks[0].node).run(
        ["sh", "-c", script, "alive", *(str(r.pid) for r in ranks)], timeout_s=PROBE_TIMEOUT_S
    )
    if not result.ok:
        return {r.rank: None for r in ranks}
    seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    return {r.rank: seen.get(str(r.pid)) == str(r.start_ticks) for r in ranks}


# Arguments: container ids. Prints "ID running|exited|gone" per container; exit 3 when docker does not answer.
_INSPECT_SH = r"""
docker info >/dev/null 2>&1 || { echo "docker does not answer" >&2; exit 3; }
for c in "$@"; do
  s=$(docker inspect -f '{{.State.Running}}' "$c" 2>/dev/null) || s=gone
  case $s in true) s=running;; false) s=exited;; esac
  echo "$c $s"
done
"""


def containers_alive(ranks: list[RankProcess]) -> dict[int, bool | None]:
    """Liveness of container ranks on one node: one `docker inspect` per container, one command per node."""
    result = node_for(ranks[0].node).run(
        ["sh", "-c", _INSPECT_SH, "inspect", *(r.container for r in ranks)], timeout_s=PROBE_TIMEOUT_S
    )
    if not result.ok:
        return {r.rank: None for r in ranks}
    seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    return {r.rank: seen.get(r.container) == "running" if r.container in seen else None for r in ranks}


@dataclass(frozen=True)
class Record:
    """What the run folder says: the run (None: nothing recorded) and, when state.json could not be read, why."""

    state: RunState | None
    problem: str = ""


def save_state(run_dir: Path, state: RunState) -> None:
    """Each rank's own record, then state.json; a rank no longer in the state loses its record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run = {k: v for k, v in asdict(state).items() if k != "ranks"}
    for rank in state.ranks:
        _write_atomically(run_dir / RANK_FILE.format(rank.rank), json.dumps({**run, "rank": asdict(rank)}))
    kept = {RANK_FILE.format(r.rank) for r in state.ranks}
    for path in _rank_files(run_dir):
        if path.name not in kept:
            path.unlink(missing_ok=True)
    _write_atomically(run_dir / STATE_FILE, json.dumps(asdict(state), indent=2))


def _write_atomically(path: Path, text: str) -> None:
    """Whole or not at all, also across a crash: a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself
    finally:
        os.close(folder)


def _rank_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob(RANK_FILE.format("[0-9]*")))


def _state_from(data: dict) -> RunState:
    ranks = tuple(RankProcess(**r) for r in data.pop("ranks"))
    return RunState(**{**data, "ports": tuple(data.get("ports", ()))}, ranks=ranks)


def read_record(run_dir: Path) -> Record:
    """The recorded run; from the ranks' own records when state.json is unreadable (or missing beside them)."""
    path = run_dir / STATE_FILE
    try:
        return Record(_state_from(json.loads(path.read_text())))
    except FileNotFoundError:
        if not _rank_files(run_dir):
            return Record(None)
        problem = f"{path} is missing"
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        problem = f"{path} is unreadable ({type(error).__name__}: {error})"
    return Record(_from_rank_files(run_dir), problem)


def _from_rank_files(run_dir: Path) -> RunState | None:
    """The run the newest rank records describe (a record that does not parse is left out)."""
    found = []
    for path in _rank_files(run_dir):
        try:
            data = json.loads(path.read_text())
            rank = RankProcess(**data.pop("rank"))
            found.append((_state_from({**data, "ranks": []}), rank))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    if not found:
        return None
    newest = max(state.started_at for state, _ in found)
    ranks = tuple(sorted((r for state, r in found if state.started_at == newest), key=lambda r: r.rank))
    run = next(state for state, _ in found if state.started_at == newest)
    return dataclasses.replace(run, ranks=ranks)


def has_record(run_dir: Path) -> bool:
    """Whether the folder holds a run record (state.json or a rank's own record), readable or not."""
    return (run_dir / STATE_FILE).exists() or bool(_rank_files(run_dir))


def load_state(run_dir: Path) -> RunState | None:
    return read_record(run_dir).state


def clear_state(run_dir: Path) -> None:
    """The ranks' records first: a clear cut short leaves state.json, which still names the ranks."""
    for path in _rank_files(run_dir):
        path.unlink(missing_ok=True)
    (run_dir / STATE_FILE).unlink(missing_ok=True)
