"""The checkpoint on every Spark: a manifest per node and a resumable, verified copy from the head (the pinned
download onto the head is download.py).

A manifest is every file under the checkpoint folder as seen through links (relative path, size): what the engine
reads. It is sorted by bytes, so two machines with different locales agree. The copy is rsync over the worker's
ssh options. A snapshot of the Hugging Face cache goes in two passes (`Layout`): the blobs first (`-a -L
--partial`: xet-backend blob links arrive as files, an interrupted copy keeps what arrived and the next run sends
only the rest), then the snapshot's links, so a worker's cache is a cache again and never links to half a blob.
After copying, files the head lacks are removed from the worker's folder, the manifests are compared again and the
first differences are reported.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from recipe.errors import RecipeError
from recipe.net.nodes import Node, SshNode
from recipe.settings import Settings

Manifest = tuple[tuple[str, int], ...]
SHOWN_DIFFERENCES = 20
COPY_TIMEOUT_S = 6 * 3600


class CheckpointError(RecipeError):
    """The checkpoint is missing, cannot be fetched, or a worker's copy differs from the head's."""


@dataclass(frozen=True)
class CopyResult:
    worker: str
    sent_bytes: int  # what rsync put on the wire (a resumed copy sends only the rest)
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
    repo = os.path.join(settings.hf_cache, "hub", f"models--{org}--{name}")
    revision = settings.model_revision or "main"
    if not re.fullmatch(r"[0-9a-f]{40}", revision):  # a branch or tag: the cache names its commit in refs/
        try:
            with open(os.path.join(repo, "refs", revision)) as ref:
                revision = ref.read().strip() or revision
        except OSError:
            pass
    return os.path.join(repo, "snapshots", revision)


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
        raise CheckpointError(f"cannot list {folder} on {node.name}: {result.last_error_line()}", node.fix_for(result))
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


@dataclass(frozen=True)
class Layout:
    """What a copy sends, relative to `root` (where rsync runs from, the same path on the worker).

    A snapshot of a Hugging Face cache (`<repo>/snapshots/<rev>`) is sent as the cache holds it: first `blobs`
    (the files the snapshot's links point to, links followed, so a xet-backend blob that is itself a link arrives
    as a file, and any file of the snapshot that is not such a link), then `links` (the snapshot's links into
    `blobs/` and the refs naming this revision, as links and small files). A worker therefore never holds a link
    to a blob that has not fully arrived, and its cache stays a cache. Any other folder is sent whole (`blobs` is
    None), links followed."""

    root: str
    blobs: tuple[str, ...] | None
    links: tuple[str, ...] = ()


def hf_repo_of(folder: str) -> str | None:
    """The model folder of an HF cache that `folder` is a snapshot of (`.../models--org--name`), or None."""
    snapshots = os.path.dirname(os.path.normpath(folder))
    repo = os.path.dirname(snapshots)
    if os.path.basename(snapshots) == "snapshots" and os.path.isdir(os.path.join(repo, "blobs")):
        return repo
    return None


def layout_of(folder: str) -> Layout:
    """How to send `folder` (read on this machine, the head)."""
    repo = hf_repo_of(folder)
    if repo is None:
        return Layout(folder.rstrip("/"), None)
    blobs_dir = os.path.join(repo, "blobs") + os.sep
    blobs, links = [], []
    for here, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(here, name)
            if not os.path.exists(path):
                continue  # a broken link: nothing the engine could read
            entry = os.path.relpath(path, repo)
            target = _link_target(path)
            if target is not None and target.startswith(blobs_dir):
                blobs.append(os.path.relpath(target, repo))
                links.append(entry)
            else:
                blobs.append(entry)
    revision = os.path.basename(os.path.normpath(folder))
    links += [os.path.join("refs", ref) for ref in _refs_naming(repo, revision)]
    return Layout(repo, tuple(dict.fromkeys(blobs)), tuple(links))


def _link_target(path: str) -> str | None:
    """Where the link `path` points, one step (not followed further), as a normalised path; None for a file."""
    if not os.path.islink(path):
        return None
    return os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))


def _refs_naming(repo: str, revision: str) -> list[str]:
    refs = os.path.join(repo, "refs")
    found = []
    for here, _, files in os.walk(refs):
        for name in files:
            try:
                with open(os.path.join(here, name)) as ref:
                    if ref.read().strip() == revision:
                        found.append(os.path.relpath(os.path.join(here, name), refs))
            except OSError:
                continue
    return sorted(found)


def rsync_argv(worker: SshNode, root: str, files_from: str | None = None, follow_links: bool = True) -> list[str]:
    """rsync of `root` (or of the NUL-separated paths listed in the file `files_from`, relative to it) to the same
    path on `worker`, over the worker's own ssh options."""
    argv = ["rsync", "-a", *(["-L", "--partial"] if follow_links else []), "--stats", "--timeout=60"]
    if files_from:
        argv += ["--from0", f"--files-from={files_from}"]
    root = root.rstrip("/")
    return [*argv, "-e", worker.ssh_command(), root + "/", f"{worker.target}:{root}/"]


def copy_to_worker(
    head: Node, worker: SshNode, folder: str, on_line: Callable[[str], None] = lambda line: None
) -> CopyResult:
    """Copy `folder` to the same path on `worker` (see `Layout`), remove what the head's copy does not hold, then
    prove the copy complete by comparing manifests."""
    want = read_manifest(head, folder)
    if not want:
        raise CheckpointError(
            f"{folder} is empty or missing on this machine",
            "download it first (sparks doctor says what is there), or point CHECKPOINT at the folder",
        )
    layout = layout_of(folder)
    made = worker.run(["mkdir", "-p", layout.root], timeout_s=60)
    if not made.ok:
        raise CheckpointError(
            f"cannot create {layout.root} on {worker.name}: {made.last_error_line()}", worker.fix_for(made)
        )
    if layout.blobs is None:
        sent = _rsync(rsync_argv(worker, layout.root), worker, layout.root, on_line)
    else:
        sent = _send_list(worker, layout.root, layout.blobs, True, on_line)
        sent += _send_list(worker, layout.root, layout.links, False, on_line)
    _remove_extra(worker, folder, want)
    verify_copy(worker, folder, want)
    return CopyResult(worker.name, sent, len(want), sum(size for _, size in want))


def _send_list(
    worker: SshNode, root: str, paths: Sequence[str], follow_links: bool, on_line: Callable[[str], None]
) -> int:
    if not paths:
        return 0
    with tempfile.NamedTemporaryFile("wb", prefix="sparks-files-", suffix=".list") as listing:
        listing.write(b"".join(os.fsencode(p) + b"\0" for p in paths))
        listing.flush()
        return _rsync(rsync_argv(worker, root, listing.name, follow_links), worker, root, on_line)


def _remove_extra(worker: Node, folder: str, want: Manifest) -> None:
    """Files in the worker's folder that the head's does not hold (a stale or foreign file the engine might
    read): removed, so the manifests can agree."""
    extra = sorted(set(dict(read_manifest(worker, folder))) - set(dict(want)))
    if not extra:
        return
    removed = worker.run(["sh", "-c", 'cd "$1" && shift && rm -f -- "$@"', "remove", folder, *extra], timeout_s=120)
    if not removed.ok:
        raise CheckpointError(
            f"cannot remove {len(extra)} file(s) the head does not have from {folder} on "
            f"{worker.name} (first: {extra[0]}): {removed.last_error_line()}",
            _owner_fix(folder),
        )


def _owner_fix(folder: str) -> str:
    return (
        f"a container may have left it owned by root: sudo chown -R $USER {folder} on the worker, "
        "then run the copy again"
    )


def _rsync(argv: Sequence[str], worker: SshNode, root: str, on_line: Callable[[str], None]) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
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
        denied = any("Permission denied" in line for line in lines)
        raise CheckpointError(
            f"copying to {worker.name} stopped (rsync exit code {code}): {last}",
            _owner_fix(root)
            if denied
            else "run the same command again: what arrived is kept and only the rest is sent",
        )
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
        raise CheckpointError(
            f"{worker.name}'s copy of {folder} differs from the head's after the copy "
            f"(first differences: {'; '.join(shown)})",
            "run the copy again (sparks copy); if it keeps differing, check the worker's disk",
        )


def compare(head: Node, worker: Node, folder: str) -> list[str]:
    """Differences between the head's and a worker's copy; empty when they agree."""
    return differences(read_manifest(head, folder), read_manifest(worker, folder))
