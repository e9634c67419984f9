"""Helpers the recipe tests import (a module of its own: several conftest.py files may exist under tests/)."""

from __future__ import annotations

from ports import free_port  # noqa: F401 (re-exported: tests/ is on sys.path, tests/conftest.py)
from runs import clean_environ  # noqa: F401 (re-exported)

from recipe.settings.schema import load_specs

SETTING_NAMES = tuple(load_specs())
