"""Settings: config/settings.yaml's specs (`schema`), .env and scripts/local.sh read as data (`sources`), the frozen
effective `Settings` (`loader`), the rules between settings (`validate`) and the README's table (`docs`).

What nearly every caller needs is exported here; the rest is imported from its module."""

from recipe.settings.loader import Settings, config_root, field_names, load_settings
from recipe.settings.schema import REPO_ROOT

__all__ = ["REPO_ROOT", "Settings", "config_root", "field_names", "load_settings"]
