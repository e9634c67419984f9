"""Expected failures: each carries what went wrong and what to do about it.

The CLI is the one place that turns these into output and an exit code; everything below it raises.
"""

from __future__ import annotations


class RecipeError(Exception):
    """A failure the user can fix: `message` says what is wrong, `fix` what to do instead."""

    exit_code = 1

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def one_line(self) -> str:
        return f"{self.message}: {self.fix}" if self.fix else self.message


class SettingError(RecipeError):
    """A setting has a value the recipe cannot use; raised before anything is touched."""

    exit_code = 2


class LaunchError(RecipeError):
    """A rank did not start, did not become ready, or answered wrongly. `logs` holds each rank's last lines."""

    def __init__(self, message: str, fix: str = "", logs: dict[str, list[str]] | None = None) -> None:
        super().__init__(message, fix)
        self.logs = logs or {}
