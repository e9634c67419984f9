"""What is running: the state file a launch writes (LOG_DIR/run/state.json) and checks on the processes it names.

A PID alone can be reused by an unrelated program after ours exits, so each rank is recorded with its PID *and*
its start time from /proc; a rank counts as ours only while both match.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_FILE = "state.json"


@dataclass(frozen=True)
class RankProcess:
    rank: int
    pid: int
    start_ticks: int   # field 22 of /proc/PID/stat: when the process started, in clock ticks since boot
    log: str


@dataclass(frozen=True)
class RunState:
    runtime: str
    served_name: str
    api_url: str
    health_url: str
    started_at: float
    ranks: tuple[RankProcess, ...]

    def alive(self) -> dict[int, bool]:
        return {r.rank: is_alive(r.pid, r.start_ticks) for r in self.ranks}

    @property
    def all_alive(self) -> bool:
        return all(self.alive().values())

    @property
    def any_alive(self) -> bool:
        return any(self.alive().values())


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
