"""Shared fixtures for the recipe tests: an empty config root (the CLI sandbox is tests/conftest.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty config root (no .env, no scripts/local.sh)."""
    (tmp_path / "scripts").mkdir()
    return tmp_path
