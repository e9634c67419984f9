"""What the tests that run the README's wrappers share: where a run is recorded (LOG_DIR/run/<checkout>,
recipe/settings/values.py), a private environment for a local run, and running a checkout's script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ports import free_port

from recipe.settings import REPO_ROOT
from recipe.settings.schema import load_specs
from recipe.settings.values import checkout_key

RUN = f"run/{checkout_key()}"  # relative to a LOG_DIR


def run_dir(log_dir: Path) -> Path:
    return log_dir / "run" / checkout_key()


def clean_environ(**overrides: str) -> dict[str, str]:
    """This process's environment without any setting (the machine may export e.g. CONTAINER_NAME), plus overrides."""
    names = set(load_specs()) | {"SPARKS_CONFIG_ROOT"}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(overrides)
    return env


def local_env(folder: Path, **overrides: str) -> dict[str, str]:
    """A local run of its own: an empty config root, LOG_DIR and CACHE_DIR under `folder`, loopback, free ports."""
    config = folder / "config"
    (config / "scripts").mkdir(parents=True, exist_ok=True)
    return clean_environ(
        **{
            "SPARKS_CONFIG_ROOT": str(config),
            "LOG_DIR": str(folder / "logs"),
            "CACHE_DIR": str(folder / "cache"),
            "HOST": "127.0.0.1",
            "PORT": str(free_port()),
            "MASTER_PORT": str(free_port()),
            **overrides,
        }
    )


def run_script(
    env: dict[str, str], *command: str, checkout: Path = REPO_ROOT, timeout: float = 900
) -> subprocess.CompletedProcess:
    """`command[0]` (a path inside `checkout`, e.g. start.sh or .venv/bin/sparks) run there with `env`."""
    return subprocess.run(
        [str(checkout / command[0]), *command[1:]],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
