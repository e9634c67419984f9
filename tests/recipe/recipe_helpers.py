"""Helpers the recipe tests import (a module of its own: several conftest.py files may exist under tests/)."""

from __future__ import annotations

import os

from ports import free_port  # noqa: F401 (re-exported: tests/ is on sys.path, tests/conftest.py)

from recipe.settings.schema import load_specs

SETTING_NAMES = tuple(load_specs())


def clean_environ(**overrides: str) -> dict[str, str]:
    """This process's environment without any setting (the machine may export e.g. CONTAINER_NAME), plus overrides."""
    env = {k: v for k, v in os.environ.items() if k not in SETTING_NAMES and k != "SPARKS_CONFIG_ROOT"}
    env.update(overrides)
    return env
