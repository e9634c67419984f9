"""Every setting rejects a bad value in one line naming it, before anything is stopped, started or written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recipe.cli import app
from recipe.settings.schema import load_specs

INVALID = {
    "TP": "4",
    "WORKER": "user@@spark2",
    "WORKER2": "bad host!",
    "FABRIC_PEER": "300.1.1.1",
    "FABRIC_PEER2": "a_b",
    "MASTER_PORT": "70000",
    "MODEL_ID": "no-slash",
    "MODEL_REVISION": "has space",
    "HF_CACHE": "relative/path",
    "HF_TOKEN": "two words",
    "SERVED_NAME": "bad name",
    "HOST": "localhost",
    "PORT": "80a",
    "PARALLEL": "9",
    "CONTEXT": "2000000",
    "MAX_TOKENS": "0",
    "KV": "fp4",
    "DENSE": "int8",
    "DRAFTER": "dflash2",
    "DRAFT_TOKENS": "8",
    "PREFILL_CHUNK": "8",
    "PROMPT_REUSE": "sometimes",
    "PROMPT_REUSE_GIB": "2000",
    "THINKING": "yes",
    "VISION": "2",
    "VISION_URLS": "true",
    "VISION_MAX_IMAGES": "0",
    "VISION_MAX_MB": "big",
    "VISION_MAX_PIXELS": "-1",
    "VISION_MAX_VIDEOS": "17",
    "VISION_MAX_FRAMES": "1",
    "VISION_VIDEO_TOKENS": "lots",
    "KV_POOL_GIB": "-1",
    "MEMORY_RESERVE_GIB": "lots",
    "MEMORY_WARN_GIB": "-5",
    "KDA_CHUNKED": "on",
    "CUDA_GRAPHS": "2",
    "IMAGE": "Bad Image",
    "BASE_IMAGE": "Not An Image",
    "IMAGE_OFFLINE": "2",
    "CONTAINER_NAME": "-bad",
    "RUNTIME": "kubernetes",
    "CHECKPOINT": "rel/dir",
    "CACHE_DIR": "rel",
    "DRY_RUN": "maybe",
    "WAIT_TIMEOUT": "0",
    "LOG_DIR": "logs",
    "LOG_KEEP": "-2",
    "STOP_TIMEOUT": "1h",
    "PEER_TIMEOUT_S": "2",
    "FOREGROUND": "yes",
    "API_KEY": "has space",
    "DOCKER_ARGS": "-v '/a b:/c",
}

RULES = [
    ({"TP": "3", "WORKER": "me@spark2"}, "WORKER2 is empty"),
    ({"TP": "2", "WORKER": "me@spark2", "WORKER2": "me@spark3"}, "WORKER2 is set too"),
    ({"TP": "3", "WORKER": "me@spark2", "WORKER2": "other@SPARK2"}, "same node"),
    ({"RUNTIME": "process", "TP": "3", "WORKER": "me@127.0.0.9"}, "WORKER2 is empty"),
    ({"RUNTIME": "docker", "TP": "2"}, "WORKER is empty"),
    ({"PORT": "9000", "MASTER_PORT": "9000"}, "PORT and MASTER_PORT"),
    ({"VISION": "0", "VISION_URLS": "1"}, "VISION_URLS=1"),
    ({"VISION_MAX_FRAMES": "129", "VISION_VIDEO_TOKENS": "64"}, "VISION_VIDEO_TOKENS=64"),
    ({"FABRIC_PEER": "10.0.0.2"}, "FABRIC_PEER=10.0.0.2"),
    ({"WORKER2": "me@spark3"}, "WORKER2=me@spark3"),
]


def run(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *args: str):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return CliRunner().invoke(app, list(args) or ["start"])


def assert_rejected_untouched(result, sandbox: Path, *words: str) -> None:
    assert result.exit_code != 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error:") and all(w in lines[0] for w in words), lines[0]
    assert not (sandbox / "logs").exists() and not (sandbox / "cache").exists()


def test_every_setting_has_an_invalid_case() -> None:
    assert set(INVALID) == set(load_specs())


@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_value_is_rejected(sandbox: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    result = run(monkeypatch, {name: INVALID[name]})
    assert_rejected_untouched(result, sandbox, name, "write ")
    if load_specs()[name].is_secret:
        assert INVALID[name] not in result.output
    else:
        assert repr(INVALID[name]) in result.output


@pytest.mark.parametrize("env, words", RULES)
def test_rules_between_settings(sandbox: Path, monkeypatch: pytest.MonkeyPatch, env: dict, words: str) -> None:
    assert_rejected_untouched(run(monkeypatch, env), sandbox, words)


def test_malformed_local_sh_is_rejected_by_start(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (sandbox / "config-root" / "scripts" / "local.sh").write_text("WORKER=\nalias x=y\n")
    assert_rejected_untouched(run(monkeypatch, {}), sandbox, "scripts/local.sh line 2")


def children() -> set[int]:
    """PIDs whose parent is this test process."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            found.add(int(stat.parent.name))
    return found


def test_dry_run_prints_the_plan_and_writes_nothing(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = children()
    result = run(monkeypatch, {"DRY_RUN": "1", "API_KEY": "sk-very-secret-key"})
    assert result.exit_code == 0, result.output
    assert children() <= before
    assert "engine serve" in result.output and "--rank 1" in result.output and "--rank 0" in result.output
    assert "sk-very-secret-key" not in result.output
    assert not (sandbox / "logs").exists() and not (sandbox / "cache").exists()


def test_unexpected_errors_print_one_line_without_traceback(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("recipe.cli.start.build_plan", lambda *a, **k: 1 / 0)
    result = run(monkeypatch, {}, "plan")
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.output and "Traceback" not in result.output
    monkeypatch.setenv("SPARKS_DEBUG", "1")
    assert isinstance(CliRunner().invoke(app, ["plan"]).exception, ZeroDivisionError)


def test_docker_start_checks_the_worker_over_ssh_first(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # RUNTIME=docker (the default with WORKER): start checks the worker over ssh before anything is stopped or
    # written. A loopback address no sshd answers on: no traffic leaves this machine.
    monkeypatch.setenv("SPARKS_SSH_CONTROL_DIR", str(sandbox / "ctl"))
    result = run(monkeypatch, {"WORKER": "me@127.0.0.9", "PORT": "8899"})
    assert result.exit_code != 0, result.output
    assert "error: ssh (me@127.0.0.9)" in result.output
    assert not (sandbox / "logs").exists() and not (sandbox / "cache").exists()


def test_process_ranks_on_a_worker_are_checked_over_ssh_first(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # RUNTIME=process with WORKER runs rank 1 as a process on the worker: start checks the worker over ssh before
    # anything is stopped or written. A loopback address no sshd answers on: no traffic leaves this machine.
    monkeypatch.setenv("SPARKS_SSH_CONTROL_DIR", str(sandbox / "ctl"))
    result = run(monkeypatch, {"RUNTIME": "process", "WORKER": "me@127.0.0.9", "PORT": "8899"})
    assert result.exit_code != 0, result.output
    assert "error: ssh (me@127.0.0.9)" in result.output and "Docker" not in result.output
    assert not (sandbox / "logs").exists() and not (sandbox / "cache").exists()
