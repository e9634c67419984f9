"""`--engine DIR` for a bench: import `engine` from another checkout (a git worktree of an earlier commit), to time
before and after in turn. DIR goes first on sys.path, and the project's editable-install finder is left out, so a
module missing from that tree fails to import instead of coming from this checkout. Call `from_argv()` before
anything imports engine."""

from __future__ import annotations

import sys
from pathlib import Path


def from_argv() -> str | None:
    """Take `--engine DIR` (or `--engine=DIR`) out of sys.argv and import engine from DIR from now on; the DIR, or
    None."""
    at = next((i for i, arg in enumerate(sys.argv) if arg == "--engine" or arg.startswith("--engine=")), None)
    if at is None:
        return None
    if "=" in sys.argv[at]:
        root, taken = sys.argv[at].split("=", 1)[1], 1
    elif at + 1 < len(sys.argv):
        root, taken = sys.argv[at + 1], 2
    else:
        raise SystemExit("--engine needs a directory: a checkout (git worktree) whose engine to import")
    del sys.argv[at : at + taken]
    where = Path(root).resolve()
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, str(where))
    import engine

    if not engine.__file__ or not Path(engine.__file__).resolve().is_relative_to(where):
        raise SystemExit(f"--engine {root}: engine still comes from {engine.__file__}")
    return str(where)
