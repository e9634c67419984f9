"""Stop and status of the local ranks recorded in the state file.

`stop` asks every rank to exit (SIGTERM to the rank's process group: it and whatever it started), waits up to
STOP_TIMEOUT, kills what is left, saves each rank's log gzipped under LOG_DIR and clears the run folder.
Every rank's outcome is reported, not just the first failure.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from recipe.launch import Reporter, probe_health
from recipe.logs import save_log
from recipe.runstate import RankProcess, RunState, clear_state, is_alive, load_state


@dataclass(frozen=True)
class RankStop:
    rank: int
    pid: int
    outcome: str             # "stopped" | "killed" | "was not running"
    saved_log: Path | None


@dataclass(frozen=True)
class StopResult:
    found: bool                      # a recorded run existed
    requests_cut: int                # requests that were running when the stop began
    ranks: tuple[RankStop, ...] = ()


@dataclass(frozen=True)
class Status:
    state: RunState | None
    alive: dict[int, bool]
    health: dict | None

    @property
    def running(self) -> bool:
        return bool(self.alive) and all(self.alive.values())

    @property
    def partly_running(self) -> bool:
        return any(self.alive.values()) and not self.running


def status(run_dir: Path) -> Status:
    state = load_state(run_dir)
    if state is None:
        return Status(None, {}, None)
    alive = state.alive()
    health = probe_health(state.health_url) if alive.get(0) else None
    return Status(state, alive, health)


def requests_running(health: dict | None) -> int:
    value = (health or {}).get("requests_running", 0)
    return value if isinstance(value, int) else 0


def stop(run_dir: Path, log_dir: Path, keep: int, timeout_s: float, reporter: Reporter) -> StopResult:
    state = load_state(run_dir)
    if state is None:
        return StopResult(found=False, requests_cut=0)
    cut = requests_running(probe_health(state.health_url)) if state.any_alive else 0
    if cut:
        reporter.warn(f"{cut} request(s) still running will be cut off")
    # Rank 0 first: it holds the API, so clients stop getting answers before the other ranks go.
    ordered = sorted(state.ranks, key=lambda r: r.rank)
    signalled = {r.rank: _signal(r, signal.SIGTERM) for r in ordered}
    _wait_gone([r for r in ordered if signalled[r.rank]], timeout_s)
    outcomes = []
    for proc in ordered:
        outcome = "was not running"
        if signalled[proc.rank]:
            outcome = "killed" if _kill_leftovers(proc) else "stopped"
        saved = save_log(Path(proc.log), log_dir, proc.rank, keep)
        outcomes.append(RankStop(proc.rank, proc.pid, outcome, saved))
    _clear_run_dir(run_dir, state)
    return StopResult(found=True, requests_cut=cut, ranks=tuple(outcomes))


def _signal(proc: RankProcess, sig: signal.Signals) -> bool:
    """Signal the rank's process group, only while the PID is still the process we started."""
    if not is_alive(proc.pid, proc.start_ticks):
        return False
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        os.kill(proc.pid, sig)
    return True


def _wait_gone(procs: list[RankProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_alive(p.pid, p.start_ticks) for p in procs):
        time.sleep(0.1)


def _kill_leftovers(proc: RankProcess) -> bool:
    """SIGKILL the rank's group when the rank (or anything it started) outlived the timeout."""
    killed = False
    if is_alive(proc.pid, proc.start_ticks):
        os.kill(proc.pid, signal.SIGKILL)
        killed = True
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # children left in the group after the rank itself exited
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and is_alive(proc.pid, proc.start_ticks):
        time.sleep(0.05)
    return killed


def _clear_run_dir(run_dir: Path, state: RunState) -> None:
    for proc in state.ranks:
        Path(proc.log).unlink(missing_ok=True)
    (run_dir / "api_key").unlink(missing_ok=True)
    clear_state(run_dir)
