"""Fixtures of the reliability tests: a private config root, log and cache folders, free ports (as tests/recipe)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ports import free_port  # tests/ is on sys.path (tests/conftest.py)

from recipe.settings.schema import load_specs


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The CLI run in-process against a private config root, log and cache folders, and free ports."""
    config = tmp_path / "config-root"
    (config / "scripts").mkdir(parents=True)
    for name in load_specs():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARKS_CONFIG_ROOT", str(config))
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("PORT", str(free_port()))
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("HOST", "127.0.0.1")
    return tmp_path
