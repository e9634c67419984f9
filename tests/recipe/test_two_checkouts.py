"""Two checkouts on one machine, sharing LOG_DIR and CACHE_DIR (the defaults), each serving on its own PORT: each
records its run under LOG_DIR/run/<checkout>, so `./stop.sh` in one leaves the other serving, and `sparks status`
names the checkout that owns a run. The second checkout is a copy of this one (same code, another folder)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from runs import local_env, run_script

from recipe.settings import REPO_ROOT

pytestmark = pytest.mark.slow
COPIED = ("config", "engine", "recipe", "scripts", "start.sh", "stop.sh", "pyproject.toml")


def _copy_checkout(where: Path) -> Path:
    where.mkdir()
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, where / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, where / name)
    (where / ".venv").symlink_to(REPO_ROOT / ".venv")  # the same environment; PYTHONPATH picks the copy's code
    return where


def _env(checkout: Path, shared: Path) -> dict[str, str]:
    """Each checkout's own config root and ports; LOG_DIR and CACHE_DIR shared (`shared`)."""
    env = local_env(shared / f"config-{checkout.name}", PYTHONPATH=str(checkout), WAIT_TIMEOUT="300", STOP_TIMEOUT="10")
    return {**env, "LOG_DIR": str(shared / "logs"), "CACHE_DIR": str(shared / "cache")}


def _run(checkout: Path, env: dict[str, str], *command: str) -> subprocess.CompletedProcess:
    return run_script(env, *command, checkout=checkout, timeout=600)


def _serving(env: dict[str, str]) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{env['PORT']}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_stop_in_one_checkout_leaves_the_other_serving(tmp_path: Path) -> None:
    here, other = REPO_ROOT, _copy_checkout(tmp_path / "other-checkout")
    env_here, env_other = _env(here, tmp_path), _env(other, tmp_path)
    try:
        for checkout, env in ((here, env_here), (other, env_other)):
            started = _run(checkout, env, "start.sh")
            assert started.returncode == 0 and "is LIVE" in started.stdout, started.stdout + started.stderr
        assert _serving(env_here) and _serving(env_other)
        runs = sorted(p.name for p in (tmp_path / "logs" / "run").iterdir())
        assert len(runs) == 2 and any(r.startswith("other-checkout-") for r in runs), runs

        stopped = _run(other, env_other, "stop.sh")
        assert stopped.returncode == 0 and "Stopped every rank" in stopped.stdout, stopped.stdout + stopped.stderr
        assert not _serving(env_other)
        assert _serving(env_here), "stopping one checkout's run stopped the other's"

        status = _run(here, env_here, ".venv/bin/sparks", "status")
        assert status.returncode == 0 and f"Run of the checkout {here}" in status.stdout, status.stdout
        again = _run(other, env_other, "stop.sh")
        assert again.returncode == 0 and "Nothing is running" in again.stdout
    finally:
        for checkout, env in ((other, env_other), (here, env_here)):
            _run(checkout, env, "stop.sh")
    assert not _serving(env_here)
