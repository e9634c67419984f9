"""The checkpoint on every Spark: pinned download on the head, a manifest per node, a resumable verified copy.

A manifest is every file under the checkpoint folder as seen through links (relative path, size), sorted by bytes
so two machines with different locales agree. The copy is rsync over the worker's ssh options: `-a -L --partial`,
so links (the HF cache's snapshot links, xet blob links) arrive as the files they point to, and an interrupted copy
keeps what arrived; the next run sends only what is missing or different. After copying, the manifests are compared
again and the first differences are reported.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Sequence

from recipe.errors import RecipeError
from recipe.nodes import Node, SshNode
from recipe.settings import Settings

Manifest = tuple[tuple[str, int], ...]
SHOWN_DIFFERENCES = 20
COPY_TIMEOUT_S = 6 * 3600


class CheckpointError(RecipeError):
    """The checkpoint is missing, cannot be fetched, or a worker's copy differs from the head's."""


@dataclass(frozen=True)
class CopyResult:
    worker: str
    sent_bytes: int          # what rsync put on the wire (a resumed copy sends only the rest)
    files: int
    total_bytes: int


def head_checkpoint_dir(settings: Settings) -> str | None:
    """The folder the ranks serve, as a path on the head (and, the same path, on each worker); None for the
    embedded default's demo checkpoint, which every rank makes for itself."""
    if settings.checkpoint:
        return settings.checkpoint
    if settings.effective_runtime == "process":
        return None
    org, name = settings.model_id.split("/", 1)
    revision = settings.model_revision or "main"
    return os.path.join(settings.hf_cache, "hub", f"models--{org}--{name}", "snapshots", revision)


# ---------------------------------------------------------------- manifests


def parse_manifest(text: str) -> Manifest:
    entries = []
    for line in text.splitlines():
        path, _, size = line.rpartition("\t")
        if path:
            entries.append((path, int(size)))
    return tuple(sorted(entries, key=lambda e: e[0].encode()))


def read_manifest(node: Node, folder: str) -> Manifest:
    """The manifest of `folder` on `node`; empty when the folder is not there."""
    script = 'cd "$1" 2>/dev/null || exit 0; find -L . -type f -printf "%P\\t%s\\n"'
    result = node.run(["sh", "-c", script, "manifest", folder], timeout_s=300)
    if not result.ok:
        raise CheckpointError(f"cannot list {folder} on {node.name}: {result.last_error_line()}",
                              node.fix_for(result))
    return parse_manifest(result.stdout)


def missing_bytes(want: Manifest, have: Manifest) -> int:
    """Bytes of `want` that `have` lacks or holds at another size."""
    present = dict(have)
    return sum(size for path, size in want if present.get(path) != size)


def differences(head: Manifest, worker: Manifest, limit: int = SHOWN_DIFFERENCES) -> list[str]:
    """The first lines that differ, "head: path size" / "worker: path size" (a path missing on one side shows once)."""
    mine, theirs = dict(head), dict(worker)
    lines = []
    for path in sorted(set(mine) | set(theirs), key=str.encode):
        if mine.get(path) != theirs.get(path):
            lines.append(f"{path}: head {_size(mine.get(path))}, worker {_size(theirs.get(path))}")
            if len(lines) == limit:
                break
    return lines


def _size(size: int | None) -> str:
    return "missing" if size is None else f"{size} bytes"


# ---------------------------------------------------------------- copy


def rsync_argv(worker: SshNode, folder: str) -> list[str]:
    return ["rsync", "-a", "-L", "--partial", "--stats", "--timeout=60", "-e", worker.ssh_command(),
            folder.rstrip("/") + "/", f"{worker.target}:{folder.rstrip('/')}/"]


def copy_to_worker(head: Node, worker: SshNode, folder: str,
                   on_line: Callable[[str], None] = lambda line: None) -> CopyResult:
    """Copy `folder` to the same path on `worker`, then prove the copy complete by comparing manifests."""
    want = read_manifest(head, folder)
    if not want:
        raise CheckpointError(f"{folder} is empty or missing on this machine", "download it first (sparks doctor "
                              "says what is there), or point CHECKPOINT at the folder")
    made = worker.run(["mkdir", "-p", folder], timeout_s=60)
    if not made.ok:
        raise CheckpointError(f"cannot create {folder} on {worker.name}: {made.last_error_line()}",
                              worker.fix_for(made))
    sent = _rsync(rsync_argv(worker, folder), worker, on_line)
    verify_copy(worker, folder, want)
    return CopyResult(worker.name, sent, len(want), sum(size for _, size in want))


def _rsync(argv: Sequence[str], worker: SshNode, on_line: Callable[[str], None]) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    lines: list[str] = []
    for text in proc.stdout or ():
        lines.append(text.rstrip())
        on_line(text.rstrip())
    try:
        code = proc.wait(timeout=COPY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    if code != 0:
        last = next((line for line in reversed(lines) if line.strip()), f"exit code {code}")
        raise CheckpointError(f"copying to {worker.name} stopped (rsync exit code {code}): {last}",
                              "run the same command again: what arrived is kept and only the rest is sent")
    return _stat(lines, "Total bytes sent")


def _stat(lines: Sequence[str], name: str) -> int:
    for line in lines:
        if line.startswith(name + ":"):
            return int(re.sub(r"[^0-9]", "", line.split(":", 1)[1].split()[0]) or 0)
    return 0


def verify_copy(worker: Node, folder: str, want: Manifest) -> None:
    have = read_manifest(worker, folder)
    if have != want:
        shown = differences(want, have)
        raise CheckpointError(f"{worker.name}'s copy of {folder} differs from the head's after the copy "
                              f"(first differences: {'; '.join(shown)})",
                              "run the copy again (sparks copy); if it keeps differing, check the worker's disk")


def compare(head: Node, worker: Node, folder: str) -> list[str]:
    """Differences between the head's and a worker's copy; empty when they agree."""
    return differences(read_manifest(head, folder), read_manifest(worker, folder))


# ---------------------------------------------------------------- download


def download(settings: Settings, offline: bool = False) -> str:
    """The pinned snapshot in HF_CACHE: fetched from the Hub (only missing files), or, offline, a complete cached
    snapshot as it is. Returns its folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id=settings.model_id, revision=settings.model_revision or None,
                                 cache_dir=os.path.join(settings.hf_cache, "hub"), token=settings.hf_token or None,
                                 local_files_only=offline)
    except LocalEntryNotFoundError:
        raise CheckpointError(f"{settings.model_id} @ {settings.model_revision or 'main'} is not complete in "
                              f"{settings.hf_cache}, and this download is offline",
                              "run it once with network access, or copy the snapshot there") from None
