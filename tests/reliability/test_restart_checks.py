"""A restart (or a start) with a well-formed but wrong value fails in one line, with a fix, while the running server
keeps serving: a real run of stand-in ranks (tests/recipe/fake_rank.py, the real `engine serve` flags) is started
once, then restarted with each bad value; its ranks' PIDs must stay the same and rank 0 must still answer /health.
The window is checked by the real `python -m engine fit`, whose figure is compared with the loaded model's."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port
from runs import run_dir
from typer.testing import CliRunner

from recipe.cli import app
from recipe.launch import control, launch
from recipe.launch.runstate import is_alive, load_state
from recipe.plan.plan import Plan, build_plan
from recipe.reporter import Quiet
from recipe.settings import REPO_ROOT
from recipe.settings.schema import load_specs

FAKE = str(REPO_ROOT / "tests" / "recipe" / "fake_rank.py")
DEMO = REPO_ROOT / "engine" / "checkpoint" / "trained_demo"
GIB = 2**30


def with_fake_ranks(plan: Plan) -> Plan:
    """The same plan, each rank running the stand-in with the real `engine serve` flags."""
    ranks = tuple(dataclasses.replace(r, argv=(sys.executable, FAKE, *r.argv[4:])) for r in plan.ranks)
    return dataclasses.replace(plan, ranks=ranks, prepare=())


@dataclasses.dataclass
class Live:
    runner: CliRunner
    root: Path
    env: dict[str, str]

    @property
    def run_dir(self) -> Path:
        return run_dir(self.root / "logs")

    def ranks(self) -> list[tuple[int, int]]:
        state = load_state(self.run_dir)
        return [(r.pid, r.start_ticks) for r in state.ranks] if state else []

    def serving(self) -> bool:
        state = load_state(self.run_dir)
        return bool(state) and launch.probe_health(state.health_url) is not None


def _settings_env(root: Path) -> dict[str, str]:
    (root / "config-root" / "scripts").mkdir(parents=True, exist_ok=True)
    return {
        "SPARKS_CONFIG_ROOT": str(root / "config-root"),
        "LOG_DIR": str(root / "logs"),
        "CACHE_DIR": str(root / "cache"),
        "HF_CACHE": str(root / "hf"),
        "PORT": str(free_port()),
        "MASTER_PORT": str(free_port()),
        "HOST": "127.0.0.1",
        "CHECKPOINT": str(DEMO),
        "STOP_TIMEOUT": "2",
    }


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One LIVE run of stand-in ranks, shared by the bad restarts (each of which must leave it serving)."""
    root = tmp_path_factory.mktemp("live")
    with pytest.MonkeyPatch.context() as patch:
        for name in load_specs():
            patch.delenv(name, raising=False)
        env = _settings_env(root)
        for name, value in env.items():
            patch.setenv(name, value)
        patch.setattr("recipe.cli.start.build_plan", lambda s, h, extra=(): with_fake_ranks(build_plan(s, h, extra)))
        runner = CliRunner()
        started = runner.invoke(app, ["start"])
        try:
            assert started.exit_code == 0 and "is LIVE" in started.output, started.output
            yield Live(runner, root, env)
        finally:
            control.stop(run_dir(root / "logs"), root / "logs", 10, 2, Quiet())


LACKING = {
    "no such folder": None,
    "config.json is missing": "config.json",
    "tokenizer.json is missing": "tokenizer.json",
    "1 weight file(s) missing, model-00002-of-00002": "model-00002-of-00002.safetensors",
    "config.json does not parse": "",
}


def incomplete_checkpoint(folder: Path, reason: str) -> Path:
    """A copy of the demo checkpoint that is not loadable for `reason`."""
    if LACKING[reason] is None:
        return folder
    shutil.copytree(DEMO, folder)
    if LACKING[reason]:
        (folder / LACKING[reason]).unlink()
    else:
        (folder / "config.json").write_text('{"num_hidden_layers": 4,')
    return folder


def _memory_total() -> int:
    line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal:"))
    return int(line.split()[1]) * 1024


def refused_without_stopping(live: Live, *expected: str) -> str:
    before = live.ranks()
    result = live.runner.invoke(app, ["restart"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code != 0 and len(errors) == 1, result.output
    for text in expected:
        assert text in errors[0], result.output
    assert "→" in errors[0], errors[0]  # a fix comes with it
    assert live.ranks() == before and all(is_alive(pid, ticks) for pid, ticks in before)
    assert live.serving(), "the running server stopped answering"
    return errors[0]


@pytest.mark.parametrize("reason", list(LACKING))
def test_a_checkpoint_that_cannot_load_is_refused_before_the_stop(
    live: Live, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = incomplete_checkpoint(tmp_path / "checkpoint", reason)
    monkeypatch.setenv("CHECKPOINT", str(folder))
    refused_without_stopping(live, f"CHECKPOINT={folder} is not a complete checkpoint: {reason}")


def test_a_host_that_is_not_this_machines_is_refused(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST", "192.0.2.1")  # TEST-NET-1: never an address of a test machine
    refused_without_stopping(live, "HOST=192.0.2.1 is not an address of this machine", "HOST=0.0.0.0")


@pytest.mark.parametrize("name", ["PORT", "MASTER_PORT"])
def test_a_port_another_program_holds_is_refused_before_the_stop(
    live: Live, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        monkeypatch.setenv(name, str(port))
        refused_without_stopping(live, f"port {port} ({name}) is already in use on this machine by another program")


def test_a_reserve_larger_than_the_machine_is_refused(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORY_RESERVE_GIB", "1024")
    refused_without_stopping(
        live, "MEMORY_RESERVE_GIB=1024 leaves nothing of this machine's CPU memory", "MEMORY_RESERVE_GIB=<less than"
    )


def test_a_window_larger_than_the_machine_can_hold_is_refused(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    # leave ~64 MiB of this machine's memory (whatever is free now): the demo's 256 bytes a token with the default
    # MTP drafts (its DSA layer's bf16 row and the MTP layer's), two ranks
    monkeypatch.setenv("MEMORY_RESERVE_GIB", f"{(_memory_total() - 64 * 2**20) / GIB:.4f}")
    monkeypatch.setenv("CONTEXT", "1048576")
    line = refused_without_stopping(live, "CONTEXT=1048576 needs 0.50 GiB of cache (2 rank(s))", "write CONTEXT=")
    largest = int(line.split("write CONTEXT=")[1].split()[0])
    assert 100_000 < largest < 131_072


@pytest.mark.parametrize("value", ["1", "255", "-1"])
def test_a_window_too_small_for_a_chat_is_refused_with_a_valid_suggestion(
    live: Live, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTEXT", value)
    line = refused_without_stopping(live, f"not '{value}'", "0 or a whole number from 256")
    suggested = line.split("write CONTEXT=")[1].split()[0]
    assert suggested == "0" or int(suggested) >= 256


@pytest.mark.parametrize("name", ["LOG_DIR", "CACHE_DIR"])
def test_a_folder_that_cannot_be_written_is_named(live: Live, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, "/proc/nope")
    if name == "CACHE_DIR":
        monkeypatch.delenv("CHECKPOINT")  # the demo checkpoint is then made under CACHE_DIR
    line = refused_without_stopping(live, f"{name}=/proc/nope cannot be written")
    assert "port" not in line and "unexpected" not in line


def test_a_start_with_a_wrong_value_starts_nothing(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHECKPOINT", str(sandbox / "absent"))
    try:
        result = CliRunner().invoke(app, ["start"])
    finally:
        recorded = load_state(run_dir(sandbox / "logs"))
        control.stop(run_dir(sandbox / "logs"), sandbox / "logs", 10, 2, Quiet())
    assert result.exit_code != 0 and f"CHECKPOINT={sandbox / 'absent'} is not a complete checkpoint" in result.output
    assert recorded is None


def test_a_secret_equal_to_another_setting_is_no_leak(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """API_KEY=demo with SERVED_NAME=demo used to stop a restart with "internal error: a secret reached rank 1's
    command"; a restart with them now serves, and the key still reaches rank 0 only in its file."""
    monkeypatch.setenv("CHECKPOINT", str(DEMO))
    monkeypatch.setenv("STOP_TIMEOUT", "2")
    monkeypatch.setattr("recipe.cli.start.build_plan", lambda s, h, extra=(): with_fake_ranks(build_plan(s, h, extra)))
    runner = CliRunner()
    try:
        assert runner.invoke(app, ["start"]).exit_code == 0
        monkeypatch.setenv("SERVED_NAME", "demo")
        monkeypatch.setenv("API_KEY", "demo")
        monkeypatch.setenv("HF_TOKEN", "bf16")  # KV's value
        restarted = runner.invoke(app, ["restart"])
        assert restarted.exit_code == 0 and "is LIVE" in restarted.output, restarted.output
        assert (run_dir(sandbox / "logs") / "api_key").read_text() == "demo"
    finally:
        control.stop(run_dir(sandbox / "logs"), sandbox / "logs", 10, 2, Quiet())


def test_the_leak_guard_still_finds_a_secret_routed_into_a_command(
    sandbox: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from recipe.errors import RecipeError
    from recipe.plan import plan as plan_module
    from recipe.plan.host import HostFacts
    from recipe.settings import load_settings

    monkeypatch.setenv("API_KEY", "demo")
    monkeypatch.setenv("SERVED_NAME", "demo")
    serve_flags = plan_module.serve_flags
    monkeypatch.setattr(
        plan_module,
        "serve_flags",  # a defect: the key on every rank's command line
        lambda s, *args: [*serve_flags(s, *args), "--key", s.api_key],
    )
    with pytest.raises(RecipeError, match="a secret reached rank 1's command"):
        build_plan(load_settings(), HostFacts(python=sys.executable, gpu=False, cpu_count=2))


def _fit(checkpoint: Path, *flags: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "engine", "fit", str(checkpoint), *flags], capture_output=True, text=True, timeout=120
    )
    return json.loads(done.stdout)


def test_fit_bytes_per_token_are_the_loaded_models(tmp_path: Path) -> None:
    from engine.checkpoint.demo import write_demo
    from engine.models.glm5_next.model import Glm5NextForCausalLM
    from engine.parallel import ParallelGroup

    write_demo(tmp_path / "tiny", seed=0, size="tiny")
    for drafter, mtp in (("copy", False), ("mtp+copy", True)):  # the MTP layer's rows join the pool when it drafts
        model = Glm5NextForCausalLM.load(tmp_path / "tiny", ParallelGroup.single(), mtp=mtp)
        for kv in ("fp32", "bf16", "fp8"):
            answer = _fit(tmp_path / "tiny", "--kv", kv, "--device", "cpu", "--drafter", drafter)
            assert answer["bytes_per_token"] == model.cache_bytes_per_token(kv), (kv, drafter)


def test_fit_compares_with_total_memory_not_what_is_free_now() -> None:
    answer = _fit(DEMO, "--tp", "2", "--context", "8192", "--device", "cpu", "--memory-reserve-gib", "1")
    assert answer["fits"] and answer["memory_bytes"] == _memory_total() and answer["ranks_on_memory"] == 2
    assert answer["reserve_bytes"] == GIB and 0 < answer["weights_bytes"] <= 2 * 3_647_112  # the demo's bytes
    assert answer["largest_window"] == min(1_048_576, (_memory_total() - GIB - answer["weights_bytes"]) // 256)


def test_fit_counts_the_vision_tower_on_rank_0_with_vision(tmp_path: Path) -> None:
    from engine.checkpoint.demo import write_demo
    from engine.checkpoint.info import checkpoint_tensors

    write_demo(tmp_path / "tiny", seed=0, size="tiny")
    tower = sum(t.nbytes for t in checkpoint_tensors(tmp_path / "tiny") or () if t.name.startswith("model.visual."))
    without, with_tower = (
        _fit(tmp_path / "tiny", "--tp", "2", "--device", "cpu", "--vision", flag)["weights_bytes"] for flag in "01"
    )
    assert tower > 0 and with_tower - without == tower
