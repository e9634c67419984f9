"""The command line layer, the only part of the recipe that prints: the Typer app (`commands`, the one error
boundary), the start flow (`start`) and the console rendering (`ui`). `recipe.cli:app` is the `sparks` script."""

from recipe.cli.commands import app

__all__ = ["app"]
