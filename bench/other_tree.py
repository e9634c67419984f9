"""`--engine DIR` for a bench: import `engine` from another checkout (a git worktree of an earlier commit), to time
before and after in turn. The project's editable install would otherwise put this checkout's engine first, whatever
PYTHONPATH says. Call `from_argv()` before anything imports engine."""

from __future__ import annotations

import sys


def from_argv() -> str | None:
    """Take `--engine DIR` out of sys.argv and import engine from DIR from now on; the DIR, or None."""
    if "--engine" not in sys.argv:
        return None
    at = sys.argv.index("--engine")
    root = sys.argv[at + 1]
    del sys.argv[at : at + 2]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, root)
    import engine

    if not engine.__file__ or not engine.__file__.startswith(root):
        raise SystemExit(f"--engine {root}: engine still comes from {engine.__file__}")
    return root
