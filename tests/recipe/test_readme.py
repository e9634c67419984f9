"""The README's settings table is generated from config/settings.yaml and must stay equal to it."""

from __future__ import annotations

from recipe.settings import REPO_ROOT, field_names
from recipe.settings.docs import readme_table, settings_markdown
from recipe.settings.schema import load_specs


def test_readme_table_equals_settings_yaml() -> None:
    assert readme_table(REPO_ROOT / "README.md") == settings_markdown(), (
        "README.md's settings table is stale: run .venv/bin/sparks settings --write-readme"
    )


def test_every_setting_is_documented_once_and_is_a_settings_field() -> None:
    specs = load_specs()
    assert field_names() == list(specs)
    for spec in specs.values():
        assert spec.meaning and spec.consumer.split()[0] in ("recipe", "engine")
        assert (spec.default is None) == bool(spec.derived), spec.name
    table = settings_markdown()
    assert all(table.count(f"| `{name}` |") == 1 for name in specs)


def test_readme_shows_the_two_commands() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("##", 1)[0]
    assert "./start.sh" in quick and "./test.sh" in quick
