"""The machines a plan runs on: this one (`LocalNode`) and workers reached over ssh (`SshNode`).

Workers are reached with the system's `ssh` client, so the user's ~/.ssh/config, keys and known_hosts apply as
they do by hand. Every call is non-interactive (BatchMode: no password or host-key prompt can hang a start),
bounded (ConnectTimeout, keep-alives, a timeout per command) and reuses one master connection per node
(ControlMaster). Host keys are checked as the user's ssh config says; an unknown or changed key fails with ssh's
own message, which the caller reports with a fix. Group operations return every node's result.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from recipe.errors import RecipeError

CONNECT_TIMEOUT_S = 10
KEEPALIVE_S = 5  # ServerAliveInterval; three missed answers end the connection
CONTROL_PERSIST_S = 60  # how long an idle master connection stays open after the last command

T = TypeVar("T")
N = TypeVar("N", bound="Node")  # the node kind a group call hands each action (workers are SshNode)


class NodeError(RecipeError):
    """A command on a node failed or could not be run there."""


@dataclass(frozen=True)
class Result:
    node: str
    argv: tuple[str, ...]
    code: int  # exit code; 255 from ssh means the connection itself failed
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    def last_error_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1].strip() if lines else f"exit code {self.code}"


class Node:
    """A place commands run. Subclasses say how (`_wrap`)."""

    name: str = "local"
    is_local: bool = True

    def _wrap(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def run(self, argv: Sequence[str], timeout_s: float = 60, input: str | None = None) -> Result:
        try:
            done = subprocess.run(
                self._wrap(argv),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return Result(self.name, tuple(argv), 124, "", f"no answer within {timeout_s:.0f}s")
        except OSError as error:
            return Result(self.name, tuple(argv), 127, "", str(error))
        return Result(self.name, tuple(argv), done.returncode, done.stdout, done.stderr)

    def fetch(self, argv: Sequence[str], timeout_s: float = 60) -> bytes | None:
        """stdout of a command as bytes (a log may hold anything), or None when it fails or cannot be run."""
        try:
            done = subprocess.run(self._wrap(argv), capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except (subprocess.TimeoutExpired, OSError):
            return None
        return done.stdout if done.returncode == 0 else None

    def output(self, argv: Sequence[str], timeout_s: float = 20) -> str:
        """stdout of a command that must succeed."""
        result = self.run(argv, timeout_s)
        if not result.ok:
            raise NodeError(
                f"`{shlex.join(argv)}` failed on {self.name}: {result.last_error_line()}", self.fix_for(result)
            )
        return result.stdout

    def fix_for(self, result: Result) -> str:
        return "run it by hand there to see the whole message"


class LocalNode(Node):
    """This machine (the head)."""

    def __init__(self) -> None:
        self.name = "local"
        self.is_local = True


class SshNode(Node):
    """A worker, reached as `target` (user@host or a Host alias of ~/.ssh/config)."""

    def __init__(self, target: str, control_dir: str | None = None) -> None:
        self.name = target
        self.target = target
        self.is_local = False
        self.control_dir = control_dir or _default_control_dir()

    @property
    def host(self) -> str:
        return self.target.rpartition("@")[2]

    def ssh_options(self) -> list[str]:
        return [
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o",
            f"ServerAliveInterval={KEEPALIVE_S}",
            "-o",
            "ServerAliveCountMax=3",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self.control_dir}/%C",
            "-o",
            f"ControlPersist={CONTROL_PERSIST_S}",
        ]

    def ssh_command(self) -> str:
        """The `-e` value for rsync: the same options as every other command to this node."""
        return shlex.join(["ssh", *self.ssh_options()])

    def _wrap(self, argv: Sequence[str]) -> list[str]:
        # ssh hands the remote shell one string: quote each word so it arrives as given.
        return ["ssh", *self.ssh_options(), self.target, "--", shlex.join(argv)]

    def fix_for(self, result: Result) -> str:
        return ssh_fix(self.target, result)

    def close(self) -> None:
        """End the shared master connection (it would otherwise linger for ControlPersist seconds)."""
        subprocess.run(
            ["ssh", *self.ssh_options(), "-O", "exit", self.target],
            capture_output=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )


def ssh_fix(target: str, result: Result) -> str:
    """What to do about a failed ssh call, from ssh's own last words."""
    text = result.stderr.lower()
    if "host key verification failed" in text or "remote host identification has changed" in text:
        return (
            f"ssh does not know (or no longer trusts) {target}'s host key: connect once by hand "
            f"(ssh {target}) and check the fingerprint it shows"
        )
    if "permission denied" in text:
        return f"set up key-based login: ssh-copy-id {target}"
    if "could not resolve" in text or "name or service not known" in text:
        return f"check the host part of {target} (a name this machine resolves, or an address)"
    if result.code == 124 or "timed out" in text or "no route" in text or "unreachable" in text:
        return f"check that {target} is on and reachable from here (ssh {target} true)"
    if "connection refused" in text:
        return f"start its ssh server (sudo systemctl enable --now ssh on {target})"
    return f"try it by hand: ssh {target} true"


def _default_control_dir() -> str:
    # Socket paths are limited to ~100 bytes, so keep them short; one folder per user, private to them.
    # SPARKS_SSH_CONTROL_DIR moves it (the cluster test bed keeps its connections to itself).
    path = os.environ.get("SPARKS_SSH_CONTROL_DIR") or os.path.join(tempfile.gettempdir(), f"sparks-ssh-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def node_for(target: str) -> Node:
    return LocalNode() if target in ("", "local") else SshNode(target)


def on_each(nodes: Sequence[N], action: Callable[[N], T]) -> dict[str, T | BaseException]:
    """Run `action` on every node at once; each node's return value, or the exception it raised."""

    def guarded(node: N) -> T | BaseException:
        try:
            return action(node)
        except Exception as error:  # reported per node, never just the first
            return error

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        results = list(pool.map(guarded, nodes))
    return {node.name: result for node, result in zip(nodes, results)}
