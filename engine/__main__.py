"""`python -m engine serve|info|fit|make-demo …` — each subcommand lives in its own module.

A subcommand module exposes `add_arguments(parser)` and `run(args) -> int`; it is imported only when chosen, so
`make-demo` does not pay for the server's imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "serve": ("engine.serve", "run one rank: load the checkpoint, join the group, serve the API on rank 0"),
    "info": ("engine.checkpoint.info", "print a checkpoint's architecture, parameter count and bytes per rank"),
    "fit": ("engine.fit", "whether a window can ever fit this machine (config and safetensors headers only)"),
    "make-demo": ("engine.checkpoint.demo", "write a small demo checkpoint of this architecture"),
    "train-demo": (
        "engine.train.cli",
        "train the demo model on synthetic GLM-format conversations (needs transformers)",
    ),
    "quality": ("engine.quality", "what each precision mode costs in quality, against the exact mode, on one text"),
    "eval-demo": (
        "engine.train.evaluate",
        "greedy-decode held-out synthetic prompts with this engine; print a score table",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m engine")
    sub = parser.add_subparsers(dest="command", required=True)
    if argv and argv[0] in COMMANDS:
        module = importlib.import_module(COMMANDS[argv[0]][0])
        module.add_arguments(sub.add_parser(argv[0], help=COMMANDS[argv[0]][1]))
    else:
        for name, (_, help_text) in COMMANDS.items():
            sub.add_parser(name, help=help_text)
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        code = int(module.run(args) or 0)
    except SystemExit as stop:  # raised by a signal handler (serve's SIGTERM): leave the same way as a return
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    _leave_if_in_a_group(code)
    return code


def _leave_if_in_a_group(code: int) -> None:
    """A process that joined a torch.distributed group exits through `parallel.exit_process` (no interpreter
    teardown of the backend); one that never imported it (info, make-demo) returns normally."""
    if "torch.distributed" in sys.modules:
        from engine.parallel import exit_process

        exit_process(code)


if __name__ == "__main__":
    sys.exit(main())
