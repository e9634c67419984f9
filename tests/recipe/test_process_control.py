"""Start, readiness, smoke test, status and stop of real local rank processes (a stand-in rank, real HTTP)."""

from __future__ import annotations

import dataclasses
import gzip
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recipe.cli import app
from recipe.errors import LaunchError
from recipe.launch import control, launch
from recipe.launch.logs import save_log
from recipe.launch.runstate import is_alive, load_state
from recipe.launch.smoke import is_collapsed, smoke_test
from recipe.plan.host import HostFacts
from recipe.plan.plan import Plan, build_plan
from recipe.reporter import Quiet
from recipe.settings import REPO_ROOT, load_settings

FAKE = str(Path(__file__).with_name("fake_rank.py"))


def with_fake_ranks(plan: Plan, **env: str) -> Plan:
    """The same plan, each rank running the stand-in with the real `engine serve` flags."""
    ranks = tuple(
        dataclasses.replace(r, argv=(sys.executable, FAKE, *r.argv[4:]), env={**r.env, **env}) for r in plan.ranks
    )
    return dataclasses.replace(plan, ranks=ranks, prepare=())


@pytest.fixture
def fake_plan(sandbox: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CHECKPOINT", str(REPO_ROOT / "engine" / "checkpoint" / "trained_demo"))  # start checks it
    monkeypatch.setenv("STOP_TIMEOUT", "2")
    made: list[Plan] = []

    def make(**env: str) -> Plan:
        settings = load_settings()
        plan = with_fake_ranks(build_plan(settings, HostFacts(python=sys.executable, gpu=False, cpu_count=2)), **env)
        made.append(plan)
        return plan

    yield make
    for plan in made:  # never leave a rank behind, whatever the test did
        control.stop(Path(plan.run_dir), sandbox / "logs", 10, 2, Quiet())


def pids_of(plan: Plan) -> list[tuple[int, int]]:
    state = load_state(Path(plan.run_dir))
    return [(r.pid, r.start_ticks) for r in state.ranks] if state else []


def test_start_ready_smoke_stop(fake_plan, sandbox: Path) -> None:
    plan = fake_plan(FAKE_RUNNING="2")
    state, _ = launch.launch(plan, {})
    health = launch.wait_ready(plan, state, 30, Quiet())
    assert health["context_length"] == 4096
    assert smoke_test(plan.api_url, plan.served_name).text == "OK"
    assert control.status(Path(plan.run_dir)).running
    quiet = Quiet()
    result = control.stop(Path(plan.run_dir), sandbox / "logs", 10, 5, quiet)
    assert result.requests_cut == 2 and "2 request(s) still running will be cut off" in quiet.notes
    assert [r.outcome for r in result.ranks] == ["stopped", "stopped"]
    assert not any(is_alive(r.pid, r.start_ticks) for r in state.ranks)
    saved = {p.name.rsplit("-", 1)[1]: gzip.decompress(p.read_bytes()) for p in (sandbox / "logs").glob("*.log.gz")}
    assert set(saved) == {"rank0.log.gz", "rank1.log.gz"}
    assert b"fake rank 0 ready" in saved["rank0.log.gz"] and b"fake rank 1 loading" in saved["rank1.log.gz"]
    assert load_state(Path(plan.run_dir)) is None


def test_a_rank_that_exits_fails_the_wait_with_every_log(fake_plan) -> None:
    plan = fake_plan(FAKE_EXIT="3", FAKE_DELAY="1")
    state, _ = launch.launch(plan, {})
    with pytest.raises(LaunchError) as caught:
        launch.wait_ready(plan, state, 30, Quiet())
    assert "rank 1" in caught.value.message
    logs = caught.value.logs
    assert len(logs) == 2 and any("failing on purpose" in " ".join(lines) for lines in logs.values())


def test_wait_is_bounded_by_the_timeout(fake_plan) -> None:
    plan = fake_plan(FAKE_DELAY="60")
    state, _ = launch.launch(plan, {})
    started = time.monotonic()
    with pytest.raises(LaunchError, match="WAIT_TIMEOUT"):
        launch.wait_ready(plan, state, 1.5, Quiet())
    assert time.monotonic() - started < 10


def test_a_rank_ignoring_sigterm_is_killed_after_stop_timeout(fake_plan, sandbox: Path) -> None:
    plan = fake_plan(FAKE_IGNORE_TERM="1")
    state, _ = launch.launch(plan, {})
    launch.wait_ready(plan, state, 30, Quiet())
    result = control.stop(Path(plan.run_dir), sandbox / "logs", 10, 1, Quiet())
    assert {r.outcome for r in result.ranks} == {"killed"}
    assert not any(is_alive(r.pid, r.start_ticks) for r in state.ranks)


@pytest.mark.parametrize("reply", ["", "   ", "!!!!!!!!", "\n\n\n\n\n"])
def test_smoke_rejects_empty_and_collapsed_replies(fake_plan, reply: str) -> None:
    plan = fake_plan(FAKE_REPLY=reply)
    state, _ = launch.launch(plan, {})
    launch.wait_ready(plan, state, 30, Quiet())
    with pytest.raises(LaunchError, match="empty|collapsed"):
        smoke_test(plan.api_url, plan.served_name)


def test_collapse_rule() -> None:
    assert is_collapsed("") and is_collapsed("aaaa") and is_collapsed("! ! ! !")
    assert not is_collapsed("OK") and not is_collapsed("K") and not is_collapsed("the the the")


def test_saved_logs_rotate_to_log_keep(tmp_path: Path) -> None:
    live = tmp_path / "rank0.log"
    live.write_text("line\n")
    for _ in range(5):
        save_log(live, tmp_path / "saved", 0, keep=3)
    assert len(list((tmp_path / "saved").glob("*-rank0.log.gz"))) == 3
    assert save_log(live, tmp_path / "none", 0, keep=0) is None and not (tmp_path / "none").exists()


def test_cli_start_again_restart_and_stop(fake_plan, sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("recipe.cli.start.build_plan", lambda s, h, extra=(): with_fake_ranks(build_plan(s, h, extra)))
    runner = CliRunner()
    plan = fake_plan()
    first = runner.invoke(app, ["start"])
    assert first.exit_code == 0 and "is LIVE" in first.output, first.output
    before = pids_of(plan)

    again = runner.invoke(app, ["start"])
    assert again.exit_code == 0 and "already running" in again.output and pids_of(plan) == before

    monkeypatch.setenv("KV", "fp4")  # a typo: the restart must refuse before stopping anything
    bad = runner.invoke(app, ["restart"])
    assert bad.exit_code != 0 and "KV" in bad.output and pids_of(plan) == before
    assert all(is_alive(pid, ticks) for pid, ticks in before)
    monkeypatch.delenv("KV")

    dry = runner.invoke(app, ["restart"], env={"DRY_RUN": "1"})
    assert dry.exit_code == 0 and "would stop it first" in dry.output and pids_of(plan) == before

    second = runner.invoke(app, ["restart"])
    assert second.exit_code == 0 and "is LIVE" in second.output, second.output
    after = pids_of(plan)
    assert after and after != before and not any(is_alive(pid, ticks) for pid, ticks in before)
    assert runner.invoke(app, ["status"]).exit_code == 0

    stopped = runner.invoke(app, ["stop"])
    assert stopped.exit_code == 0 and "Stopped every rank" in stopped.output
    assert not any(is_alive(pid, ticks) for pid, ticks in after)
    assert runner.invoke(app, ["status"]).exit_code == 3
    assert "nothing to stop" in runner.invoke(app, ["stop"]).output


def test_foreground_follows_rank0_and_stops_the_rest_when_it_exits(
    fake_plan, sandbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "recipe.cli.start.build_plan",
        lambda s, h, extra=(): with_fake_ranks(
            build_plan(s, h, extra), FAKE_EXIT="3", FAKE_EXIT_RANK="0", FAKE_DELAY="0"
        ),
    )
    plan = fake_plan()
    result = CliRunner().invoke(app, ["start"], env={"FOREGROUND": "1"})
    assert result.exit_code == 3, result.output
    assert "fake rank 0: failing on purpose" in result.output and "rank 0 exited with code 3" in result.output
    assert load_state(Path(plan.run_dir)) is None  # rank 1 was stopped and its log saved
    assert list((sandbox / "logs").glob("*-rank1.log.gz"))
