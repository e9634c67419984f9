"""A setting is a promise: every setting config/settings.yaml hands to the engine has a flag `engine serve` parses
into `EngineConfig`, and engine code outside config.py reads that field. A setting whose consumer is the recipe
alone is read by recipe code. No setting reaches the engine through the environment."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from engine.config import EngineConfig, add_arguments
from recipe.settings.schema import load_specs

ROOT = Path(__file__).resolve().parents[2]
# fields the engine reads through one of EngineConfig's own properties or methods
READ_THROUGH = {"memory_reserve_gib": "reserve_gib", "master": "master_addr"}


def _sources(folder: str, skip: str = "") -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / folder).rglob("*.py")) if p.name != skip)


def _engine_flags() -> dict[str, str]:
    """--flag -> EngineConfig field."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return {opt: action.dest for action in parser._actions for opt in action.option_strings if opt.startswith("--")}


def test_every_engine_setting_is_a_flag_of_a_config_field_the_engine_reads() -> None:
    flags, fields = _engine_flags(), set(EngineConfig.__dataclass_fields__)
    engine_code = _sources("engine", skip="config.py")
    consumers = {name: spec.consumer for name, spec in load_specs().items() if spec.consumer.startswith("engine")}
    assert consumers, "no setting reaches the engine?"
    for name, consumer in consumers.items():
        if consumer == "engine flag (positional)":  # CHECKPOINT: serve's one positional argument
            assert "checkpoint" in fields and re.search(r"\bcfg\.checkpoint\b", engine_code)
            continue
        assert consumer.startswith("engine flag --"), f"{name}: {consumer!r} (the environment is not a channel)"
        flag = consumer.split()[-1]
        assert flag in flags, f"{name}: engine serve has no {flag}"
        field = flags[flag]
        assert field in fields, f"{name}: {flag} is not an EngineConfig field"
        read_as = READ_THROUGH.get(field, field)
        assert re.search(rf"\bcfg\.{read_as}\b", engine_code), f"{name}: nothing in engine/ reads cfg.{read_as}"


def test_every_recipe_setting_is_read_by_recipe_code() -> None:
    recipe_code = _sources("recipe")
    for name, spec in load_specs().items():
        if spec.consumer == "recipe":
            assert re.search(rf"\b{name.lower()}\b|\"{name}\"", recipe_code), f"{name}: no recipe code reads it"


def test_no_engine_code_reads_a_glm_variable() -> None:
    assert not re.search(r"GLM_[A-Z_]+", _sources("engine")), "settings reach the engine as flags only"
