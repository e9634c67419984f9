"""The code is lint-clean, formatted and type-checked as pyproject.toml configures ruff and mypy (the same checks the
pre-commit hooks run). Part of the README's test command, so CI holds every change to them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "check", [("ruff", "check", "."), ("ruff", "format", "--check", ".")], ids=["ruff-check", "ruff-format"]
)
def test_ruff(check: tuple[str, ...]) -> None:
    done = _run(*check)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def test_mypy_on_engine_and_recipe() -> None:
    done = _run("mypy", "engine", "recipe")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
