"""Stop and status of the ranks recorded in the state file, here and on workers.

`stop` asks every rank to exit (SIGTERM to the rank's process group: it and whatever it started), waits up to
STOP_TIMEOUT, kills what is left, saves each rank's log gzipped under LOG_DIR (a worker's fetched over ssh) and
clears the run folder. Container ranks (RUNTIME=docker) get `docker stop -t STOP_TIMEOUT` on their node, their logs
saved the same way, and are removed (`docker.stop_containers`). All nodes are stopped at once; every rank's outcome is reported, not just the first failure.
A worker that cannot be reached keeps its ranks in the state file, so the next stop tries them again.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipe.launch import docker, remote
from recipe.launch.launch import probe_health, read_health
from recipe.launch.logs import save_log
from recipe.launch.runstate import (
    RankProcess,
    RankStop,
    RunState,
    clear_state,
    has_record,
    is_alive,
    read_record,
    save_state,
)
from recipe.net.nodes import node_for, on_each
from recipe.reporter import Reporter


@dataclass(frozen=True)
class StopResult:
    found: bool  # a recorded run existed
    requests_cut: int  # requests that were running when the stop began
    ranks: tuple[RankStop, ...] = ()
    problem: str = ""  # why state.json could not be read (the ranks then came from their own records)


@dataclass(frozen=True)
class Status:
    state: RunState | None
    alive: dict[int, bool | None]  # None: the rank's node did not answer
    health: dict | None
    problem: str = ""  # why state.json could not be read (the ranks then came from their own records)
    said: str = "closed"  # launch.read_health's verdict: serving | not serving | silent | closed

    @property
    def running(self) -> bool:
        return bool(self.alive) and all(v is True for v in self.alive.values())

    @property
    def serving(self) -> bool:
        """Every rank runs and rank 0 does not say it cannot serve (no answer yet counts: it may be loading)."""
        return self.running and self.said in ("serving", "closed")

    @property
    def partly_running(self) -> bool:
        return any(v is not False for v in self.alive.values()) and not self.running

    @property
    def exited(self) -> list[RankProcess]:
        """Recorded ranks that are known to have exited (peer watch: the dead rank, and rank 0 after it)."""
        return [r for r in self.state.ranks if self.alive.get(r.rank) is False] if self.state else []


def run_dir_of(settings: Any) -> Path:
    """This checkout's run folder (settings.run_dir), or the one runs used before they were kept per checkout
    (LOG_DIR/run) while only that one holds a record: a run started before the upgrade is still found."""
    mine, legacy = Path(settings.run_dir), Path(settings.legacy_run_dir)
    if not has_record(mine) and has_record(legacy):
        return legacy
    return mine


def status(run_dir: Path) -> Status:
    record = read_record(run_dir)
    state = record.state
    if state is None:
        return Status(None, {}, None, record.problem)
    alive = state.alive()
    health, said = None, "closed"
    if alive.get(0):
        said, health = read_health(state.health_url, timeout_s=2.0)
    return Status(state, alive, health, record.problem, said)


def requests_running(health: dict | None) -> int:
    value = (health or {}).get("requests_running", 0)
    return value if isinstance(value, int) else 0


def stop(run_dir: Path, log_dir: Path, keep: int, timeout_s: float, reporter: Reporter) -> StopResult:
    record = read_record(run_dir)
    state = record.state
    if state is None:
        return StopResult(found=False, requests_cut=0, problem=record.problem)
    if record.problem:
        reporter.warn(f"the run record {record.problem}: the ranks were found from their own records (rank<N>.json)")
    before = state.alive()
    cut = requests_running(probe_health(state.health_url)) if any(v is not False for v in before.values()) else 0
    if cut:
        reporter.warn(f"{cut} request(s) still running will be cut off")

    def on_node(node: str) -> list[RankStop]:
        ranks = sorted((r for r in state.ranks if r.node == node), key=lambda r: r.rank)
        if ranks and ranks[0].container:
            return docker.stop_containers(node_for(node), ranks, timeout_s, log_dir, keep)
        if node == "local":
            return _stop_local(ranks, log_dir, keep, timeout_s)
        return remote.stop_ranks(node_for(node), ranks, timeout_s, log_dir, keep)

    # Every node at once; on the head rank 0 goes first with its group, so clients stop getting answers early.
    by_node = on_each([node_for(n) for n in state.nodes], lambda node: on_node(node.name))
    outcomes: list[RankStop] = []
    for node, found in by_node.items():
        if isinstance(found, BaseException):
            found = [
                RankStop(r.rank, r.pid, f"unknown: {found}", None, r.node, r.container)
                for r in state.ranks
                if r.node == node
            ]
        outcomes += found
    # A worker's rank that ran when the stop began may exit on its own first (rank 0's shutdown ends it): stopped.
    outcomes = [
        dataclasses.replace(s, outcome="stopped") if s.outcome == "was not running" and before.get(s.rank) else s
        for s in outcomes
    ]
    outcomes.sort(key=lambda s: s.rank)
    unreached = {s.rank for s in outcomes if s.outcome.startswith("unknown")}
    _clear_run_dir(run_dir, state, keep_ranks=unreached)
    return StopResult(found=True, requests_cut=cut, ranks=tuple(outcomes), problem=record.problem)


def _stop_local(ordered: list[RankProcess], log_dir: Path, keep: int, timeout_s: float) -> list[RankStop]:
    signalled = {r.rank: _signal(r, signal.SIGTERM) for r in ordered}
    _wait_gone([r for r in ordered if signalled[r.rank]], timeout_s)
    outcomes = []
    for proc in ordered:
        outcome = "was not running"
        if signalled[proc.rank]:
            outcome = "killed" if _kill_leftovers(proc) else "stopped"
        saved = save_log(Path(proc.log), log_dir, proc.rank, keep)
        Path(proc.log).unlink(missing_ok=True)
        outcomes.append(RankStop(proc.rank, proc.pid, outcome, saved))
    return outcomes


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


def _clear_run_dir(run_dir: Path, state: RunState, keep_ranks: set[int]) -> None:
    if keep_ranks:  # a worker did not answer: remember its ranks so the next stop (or start) tries again
        save_state(run_dir, dataclasses.replace(state, ranks=tuple(r for r in state.ranks if r.rank in keep_ranks)))
        return
    (run_dir / "api_key").unlink(missing_ok=True)
    clear_state(run_dir)
