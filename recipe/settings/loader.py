"""Loading the settings: defaults < .env < scripts/local.sh < environment, parsed, derived and validated once.

`load_settings` either returns a frozen `Settings` or raises a `SettingError` before anything has been touched.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from recipe.errors import SettingError
from recipe.settings.schema import REPO_ROOT, SettingSpec, expand_path, load_specs, parse_value
from recipe.settings.sources import Assignment, parse_file
from recipe.settings.validate import validate
from recipe.settings.values import Settings


def config_root(environ: Mapping[str, str]) -> Path:
    """Where .env and scripts/local.sh are read: the checkout, unless SPARKS_CONFIG_ROOT points elsewhere (tests)."""
    return Path(environ.get("SPARKS_CONFIG_ROOT") or REPO_ROOT)


def load_settings(root: Path | None = None, environ: Mapping[str, str] | None = None, rules: bool = True) -> Settings:
    """Read every source, parse each value against config/settings.yaml, derive, validate. `rules=False` skips the
    rules between settings (stop and status act on what the state file recorded, whatever TP says now)."""
    environ = os.environ if environ is None else environ
    root = config_root(environ) if root is None else root
    specs = load_specs()
    raw, origins, warnings = _collect(root, environ, specs)
    values = {name: _typed(specs[name], text, origins[name], environ) for name, text in raw.items()}
    _derive(values, origins, specs)
    settings = Settings(
        **{k.lower(): v for k, v in values.items()}, origins=MappingProxyType(origins), warnings=tuple(warnings)
    )
    if rules:
        validate(settings)
    return settings


def _collect(root: Path, environ: Mapping[str, str], specs: dict[str, SettingSpec]):
    """Raw strings per setting (later sources win) and where each came from."""
    raw: dict[str, str] = {}
    origins: dict[str, str] = {}
    warnings: list[str] = []
    for name, spec in specs.items():
        if spec.default is not None:
            raw[name], origins[name] = _as_text(spec.default), "default"
    for path, shown in ((root / ".env", ".env"), (root / "scripts" / "local.sh", "scripts/local.sh")):
        for item in parse_file(path, shown):
            if item.key not in specs:
                warnings.extend(_unknown_key(item.key, item.origin, specs))
                continue
            _refuse_references(specs[item.key], item)
            _put(raw, origins, specs[item.key], item.value, item.origin)
    for name, spec in specs.items():
        if name in environ:
            _put(raw, origins, spec, environ[name], "environment")
    return raw, origins, warnings


def _refuse_references(spec: SettingSpec, item: Assignment) -> None:
    """Files are read as data: `API_KEY="$MY_KEY"` would silently become the five characters $MY_KEY. Paths are
    the exception (their `$HOME` and `~` are expanded on purpose); a single-quoted value keeps a literal $."""
    reference = re.search(r"\$\{?[A-Za-z_]", item.value)
    if reference and spec.type != "path" and not item.literal:
        raise SettingError(
            f"{item.origin}: {spec.name} refers to a variable ({item.value[reference.start() :][:20]!r}), "
            "but settings files are read as data, not run",
            f"write the value itself, or single-quote it to keep a literal $: {spec.name}='...'",
        )


def _put(raw: dict[str, str], origins: dict[str, str], spec: SettingSpec, value: str, origin: str) -> None:
    """An empty value puts the default back (so `WORKER= ./start.sh` runs locally), unless empty has a meaning."""
    if value == "" and not spec.empty_ok:
        raw.pop(spec.name, None)
        origins.pop(spec.name, None)
        if spec.default is not None:
            raw[spec.name], origins[spec.name] = _as_text(spec.default), "default"
        return
    raw[spec.name], origins[spec.name] = value, origin


def _unknown_key(key: str, origin: str, specs: Mapping[str, SettingSpec]) -> list[str]:
    close = difflib.get_close_matches(key, list(specs), n=1, cutoff=0.75)
    if close:
        return [f"{origin}: {key} is not a setting (did you mean {close[0]}?); ignored"]
    return []  # other variables in .env (HF_HOME, ...) are none of ours


def _typed(spec: SettingSpec, text: str, origin: str, environ: Mapping[str, str]) -> Any:
    if text == "":
        return None if spec.type in ("int", "float") else ""
    return parse_value(spec, expand_path(text, environ) if spec.type == "path" else text, origin)


def _as_text(value: Any) -> str:
    return str(value)


DEMO_NAME = "GLM-5.3-Flash-demo"  # the served name says it is the demo: a client asking for the real model is told


def _derive(values: dict[str, Any], origins: dict[str, str], specs: dict[str, SettingSpec]) -> None:
    """Fill the settings whose default depends on others (their `derived` text in settings.yaml says how)."""
    embedded = values["RUNTIME"] == "process" or (values["RUNTIME"] == "auto" and not values["WORKER"])
    demo = embedded and not values["CHECKPOINT"]  # the ranks serve the trained demo (plan: _local_checkpoint)
    derived = {
        "SERVED_NAME": DEMO_NAME if demo else "GLM-5.3-Flash-EXL3",
        "HOST": "0.0.0.0" if values["WORKER"] else "127.0.0.1",
        "PARALLEL": 4,
        "CONTEXT": 8192 if embedded else (1048576 if values["KV"] == "fp8" else 196608),
        "MAX_TOKENS": 1024 if embedded else 32768,
        "KV_POOL_GIB": 1.0 if embedded else (12.5 if values["TP"] <= 2 else 32.0),
    }
    for name, value in derived.items():
        if name not in values:
            values[name], origins[name] = value, "derived"
    for name in specs:
        if name not in values:
            raise SettingError(f"settings.yaml gives {name} no default", "add a default for it to config/settings.yaml")
