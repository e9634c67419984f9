"""Shared helpers for the recipe tests: an empty config root, a clean environment, free ports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from recipe.schema import load_specs

SETTING_NAMES = tuple(load_specs())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def clean_environ(**overrides: str) -> dict[str, str]:
    """This process's environment without any setting (the machine may export e.g. CONTAINER_NAME), plus overrides."""
    env = {k: v for k, v in os.environ.items() if k not in SETTING_NAMES and k != "SPARKS_CONFIG_ROOT"}
    env.update(overrides)
    return env


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty config root (no .env, no scripts/local.sh)."""
    (tmp_path / "scripts").mkdir()
    return tmp_path


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the CLI in-process against a private config root, log and cache folders, and free ports."""
    config = tmp_path / "config-root"
    (config / "scripts").mkdir(parents=True)
    for name in SETTING_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARKS_CONFIG_ROOT", str(config))
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("PORT", str(free_port()))
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("HOST", "127.0.0.1")
    return tmp_path
