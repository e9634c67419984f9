"""Where a test's run is recorded: LOG_DIR/run/<checkout> (recipe/settings/values.py), for this checkout."""

from __future__ import annotations

from pathlib import Path

from recipe.settings.values import checkout_key

RUN = f"run/{checkout_key()}"  # relative to a LOG_DIR


def run_dir(log_dir: Path) -> Path:
    return log_dir / "run" / checkout_key()
