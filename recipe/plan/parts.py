"""What a plan is made of: one `RankPlan` per rank (its command, environment, mounts, ports, log), the steps made
once before a launch, and the secret files written for it. Values only; plan.py builds them, docker.py the Docker
side of a rank."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class RankPlan:
    rank: int
    node: str  # "local" or the ssh target it runs on
    runtime: str  # "process" or "docker"
    argv: tuple[str, ...]  # the full command
    env: Mapping[str, str]  # added on top of the node's environment
    mounts: tuple[Mount, ...] = ()
    ports: tuple[int, ...] = ()  # what this rank listens on
    log: str = ""  # where its output goes


@dataclass(frozen=True)
class PrepareStep:
    """Something made once before the first launch (the demo checkpoint); skipped when `done`."""

    description: str
    argv: tuple[str, ...]
    output: str  # argv writes here ...
    final: str  # ... and it is renamed here when it succeeds, so half a result never counts
    done: bool


@dataclass(frozen=True)
class SecretFile:
    """A file written (mode 0600) just before launch holding one secret setting's value."""

    path: str
    setting: str
