"""Helpers the recipe tests import (a module of its own: several conftest.py files may exist under tests/)."""

from __future__ import annotations

import os
import socket

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
