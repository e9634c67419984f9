"""How the core reports progress without printing: a `Reporter` is handed in (the console one lives in cli/ui.py);
`Quiet` keeps what it is told."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    def note(self, text: str) -> None: ...
    def warn(self, text: str) -> None: ...
    def line(self, source: str, text: str) -> None: ...


class Quiet:
    """A reporter that keeps what it is told (tests read `.notes`)."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)

    warn = note

    def line(self, source: str, text: str) -> None:
        self.notes.append(f"{source}: {text}")
