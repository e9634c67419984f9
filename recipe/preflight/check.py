"""What a preflight check returns and what every check looks at (preflight.py runs them in order)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from recipe.errors import RecipeError
from recipe.net.link import Link
from recipe.net.nodes import Node
from recipe.settings import Settings

GIB = 1024**3
OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    node: str  # "head", the worker's ssh target, or two workers' ("a <-> b")
    status: str  # ok | warn | fail
    message: str
    fix: str = ""


@dataclass
class Context:
    """What the checks look at. `head` runs commands here; `workers[i]` is rank i+1's node."""

    settings: Settings
    head: Node
    workers: Sequence[Node]
    sysfs_root: str = "/sys"
    api_port_ours: bool = False  # our own running server holds PORT (restart): not a conflict
    links: list[Link] = field(default_factory=list)  # filled by the link check: rank i+1's link to the head
    worker_links: list[tuple[int, int, Link]] = field(default_factory=list)  # (rank a, rank b, their link)
    # Bytes of the pinned revision the head's cache lacks, as the Hub lists them (None: do not ask the Hub).
    hub_need: Callable[[Settings], int] | None = None
    hub_answer: tuple[int | None, RecipeError | None] | None = None  # hub_need's answer (bytes, or why not)


def where(node: Node) -> str:
    return "head" if node.is_local else node.name
