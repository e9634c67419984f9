"""Shared fixtures for the recipe tests: an empty config root and an in-process CLI sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from recipe_helpers import SETTING_NAMES, free_port


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
