"""The run record (LOG_DIR/run/state.json) is written whole or not at all, and a record that cannot be read never
makes stop or status say "nothing is running" while ranks serve: they find the ranks through each rank's own record
(rank<N>.json), say the record was unreadable, and stop them. Real runs of stand-in ranks (tests/recipe/fake_rank.py)
started and stopped through the CLI."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import runs
from typer.testing import CliRunner

from recipe.cli import app
from recipe.launch import control
from recipe.launch.runstate import RankProcess, RunState, is_alive, load_state, save_state
from recipe.plan.plan import Plan, build_plan
from recipe.reporter import Quiet
from recipe.settings import REPO_ROOT

FAKE = str(REPO_ROOT / "tests" / "recipe" / "fake_rank.py")
DEMO = REPO_ROOT / "engine" / "checkpoint" / "trained_demo"
CORRUPTIONS = {
    "cut short": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "not JSON": lambda text: "\x00\x17garbage",
    "wrong shape": lambda text: '{"ranks": 3}',
}


def with_fake_ranks(plan: Plan) -> Plan:
    """The same plan, each rank running the stand-in with the real `engine serve` flags."""
    ranks = tuple(dataclasses.replace(r, argv=(sys.executable, FAKE, *r.argv[4:])) for r in plan.ranks)
    return dataclasses.replace(plan, ranks=ranks, prepare=())


@pytest.fixture
def cli(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("CHECKPOINT", str(DEMO))
    monkeypatch.setenv("STOP_TIMEOUT", "2")
    monkeypatch.setattr("recipe.cli.start.build_plan", lambda s, h, extra=(): with_fake_ranks(build_plan(s, h, extra)))
    runner = CliRunner()
    started = runner.invoke(app, ["start"])
    assert started.exit_code == 0 and "is LIVE" in started.output, started.output
    ranks = load_state(run_dir(sandbox)).ranks
    yield runner
    control.stop(run_dir(sandbox), sandbox / "logs", 10, 2, Quiet())
    for rank in ranks:  # whatever the record says by now: none of the ranks this test started outlives it
        if is_alive(rank.pid, rank.start_ticks):
            os.killpg(rank.pid, signal.SIGKILL)


def run_dir(sandbox: Path) -> Path:
    return runs.run_dir(sandbox / "logs")


def corrupt(sandbox: Path, how: str) -> None:
    path = run_dir(sandbox) / "state.json"
    path.write_text(CORRUPTIONS[how](path.read_text()))


def test_the_record_is_replaced_whole(tmp_path: Path) -> None:
    def state(ranks: int) -> RunState:
        return RunState(
            "process",
            "m",
            "http://x/v1",
            "http://x/health",
            1.0,
            tuple(RankProcess(r, 100 + r, 5, f"/l/rank{r}.log") for r in range(ranks)),
            (8888, 29551),
        )

    save_state(tmp_path, state(2))
    with open(tmp_path / "state.json") as before:  # a reader of the old record ...
        save_state(tmp_path, state(1))
        assert '"pid": 101' in before.read()  # ... still reads all of it: the new one is another file
    assert load_state(tmp_path) == state(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "state.json"]  # no temp file, no stale rank


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_stop_finds_the_ranks_of_an_unreadable_record(cli: CliRunner, sandbox: Path, how: str) -> None:
    ranks = load_state(run_dir(sandbox)).ranks
    corrupt(sandbox, how)

    status = cli.invoke(app, ["status"])
    assert status.exit_code == 0 and "unreadable" in status.output and status.output.count("running") >= 2, (
        status.output
    )
    again = cli.invoke(app, ["start"])
    assert again.exit_code == 0 and "already running" in again.output, again.output

    stopped = cli.invoke(app, ["stop"])
    assert stopped.exit_code == 0 and "unreadable" in stopped.output and "Stopped every rank" in stopped.output, (
        stopped.output
    )
    assert "Nothing is running" not in stopped.output
    assert not any(is_alive(r.pid, r.start_ticks) for r in ranks)
    assert not list(run_dir(sandbox).glob("*.json")) and len(list((sandbox / "logs").glob("*-rank*.log.gz"))) == 2
    after = cli.invoke(app, ["status"])
    assert after.exit_code == 3 and "Not running" in after.output and "unreadable" not in after.output


def test_a_restart_stops_the_ranks_of_an_unreadable_record(cli: CliRunner, sandbox: Path) -> None:
    before = load_state(run_dir(sandbox)).ranks
    corrupt(sandbox, "cut short")
    restarted = cli.invoke(app, ["restart"])
    assert restarted.exit_code == 0 and "is LIVE" in restarted.output, restarted.output
    assert not any(is_alive(r.pid, r.start_ticks) for r in before)
    assert all(is_alive(r.pid, r.start_ticks) for r in load_state(run_dir(sandbox)).ranks)


def test_a_deleted_record_is_found_from_the_rank_records(cli: CliRunner, sandbox: Path) -> None:
    ranks = load_state(run_dir(sandbox)).ranks
    os.unlink(run_dir(sandbox) / "state.json")
    status = cli.invoke(app, ["status"])
    assert status.exit_code == 0 and "state.json is missing" in status.output, status.output
    assert cli.invoke(app, ["stop"]).exit_code == 0
    assert not any(is_alive(r.pid, r.start_ticks) for r in ranks)


def test_with_no_record_left_stop_says_so_and_stops_nothing(cli: CliRunner, sandbox: Path) -> None:
    state = load_state(run_dir(sandbox))
    corrupt(sandbox, "not JSON")
    for path in run_dir(sandbox).glob("rank*.json"):
        path.unlink()
    try:
        stopped = cli.invoke(app, ["stop"])
        assert stopped.exit_code != 0 and "unreadable" in stopped.output and "nothing was stopped" in stopped.output
        assert "Nothing is running" not in stopped.output
        assert all(is_alive(r.pid, r.start_ticks) for r in state.ranks)
        status = cli.invoke(app, ["status"])
        assert status.exit_code == 3 and "whether ranks run here is unknown" in status.output, status.output
    finally:
        save_state(run_dir(sandbox), state)  # so the fixture stops them
