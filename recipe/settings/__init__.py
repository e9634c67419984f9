"""Settings: config/settings.yaml's specs (`schema`), .env and scripts/local.sh read as data (`sources`), the
frozen `Settings` (`values`), their loading (`loader`), the rules between them (`validate`), the README's table
(`docs`).

What nearly every caller needs is exported here; the rest is imported from its module."""

from recipe.settings.loader import config_root, load_settings
from recipe.settings.schema import REPO_ROOT
from recipe.settings.values import Settings, field_names

__all__ = ["REPO_ROOT", "Settings", "config_root", "field_names", "load_settings"]
