"""Preflight checks of the checkpoint and where it is kept: free disk for what is still missing, the head's pinned
snapshot (complete, or the Hub can complete it), caches this user can write, each worker's copy."""

from __future__ import annotations

import os

from recipe.checkpoint import download
from recipe.checkpoint.checkpoint import differences, head_checkpoint_dir, hf_repo_of, missing_bytes, read_manifest
from recipe.errors import RecipeError
from recipe.net.nodes import Node
from recipe.preflight.check import FAIL, GIB, OK, WARN, Check, Context, where

CHECKPOINT_ESTIMATE_GIB = 170  # the pinned checkpoint's size, when none of it is here yet
DISK_SPARE_GIB = 5  # kept free beyond what the checkpoint needs


def free_bytes(node: Node, path: str) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    script = 'p="$1"; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -Pk "$p" | tail -n 1'
    fields = node.output(["sh", "-c", script, "df", path]).split()
    return int(fields[3]) * 1024


def check_disk(ctx: Context, node: Node) -> Check:
    folder = head_checkpoint_dir(ctx.settings)
    if folder is None:
        return Check("disk", where(node), OK, "the demo checkpoint is small (made under CACHE_DIR)")
    try:
        free = free_bytes(node, folder)
        need, how = _checkpoint_need(ctx, node, folder)
    except RecipeError as error:
        return Check("disk", where(node), FAIL, error.message, error.fix)
    spare = DISK_SPARE_GIB * GIB if need else 0
    text = f"{free / GIB:.0f} GiB free under {folder}, {need / GIB:.1f} GiB of checkpoint still to come ({how})"
    if free < need + spare:
        return Check(
            "disk",
            where(node),
            FAIL,
            text,
            f"free {(need + spare - free) / GIB:.0f} GiB there, or point HF_CACHE (CHECKPOINT) at a larger disk",
        )
    return Check("disk", where(node), OK, text)


def _checkpoint_need(ctx: Context, node: Node, folder: str) -> tuple[int, str]:
    """Only what is missing counts, and how that was found: on a worker, what differs from the head's copy; on the
    head, the files the Hub lists that the cache lacks (an estimate when the Hub cannot be asked)."""
    head = read_manifest(ctx.head, folder)
    if not node.is_local:
        if not head:
            return CHECKPOINT_ESTIMATE_GIB * GIB, "estimate: the head has none of it yet"
        return missing_bytes(head, read_manifest(node, folder)), "what differs from the head's copy"
    if head and not download.incomplete_files(folder):
        return 0, "complete here"
    if ctx.hub_need is None or not download.wanted(ctx.settings):
        if head:
            return 0, "CHECKPOINT is served as it is"
        return CHECKPOINT_ESTIMATE_GIB * GIB, "estimate: none of it is here"
    need, why = ask_hub(ctx)
    if need is not None:
        return need, "the files the Hub lists that the cache lacks"
    have = sum(size for _, size in head)
    return max(0, CHECKPOINT_ESTIMATE_GIB * GIB - have), f"estimate: {why.message if why else 'unknown'}"


def ask_hub(ctx: Context) -> tuple[int | None, RecipeError | None]:
    """Bytes of the pinned revision the head's cache lacks (None and why, when the Hub cannot say); asked once."""
    if ctx.hub_answer is None:
        if ctx.hub_need is None:
            ctx.hub_answer = (None, RecipeError("the Hub was not asked"))
        else:
            try:
                ctx.hub_answer = (ctx.hub_need(ctx.settings), None)
            except RecipeError as error:
                ctx.hub_answer = (None, error)
    return ctx.hub_answer


def check_head_checkpoint(ctx: Context) -> Check:
    """The pinned snapshot on the head: complete, or fetchable (the Hub answers); an incomplete snapshot the Hub
    cannot complete stops `start` here, before anything is stopped."""
    folder = head_checkpoint_dir(ctx.settings) or ""
    missing = download.incomplete_files(folder) if os.path.isdir(folder) else ["all of it"]
    if not missing:
        return Check("checkpoint", "head", OK, f"{folder} is complete here")
    need, why = ask_hub(ctx)
    if need is not None:
        return Check(
            "checkpoint", "head", OK, f"{need / GIB:.1f} GiB still to download (start fetches it; or sparks download)"
        )
    return Check(
        "checkpoint",
        "head",
        FAIL,
        f"{ctx.settings.model_id} @ {ctx.settings.model_revision or 'main'} "
        f"is not complete here (missing {', '.join(missing[:3])}) and {why.message if why else '?'}",
        why.fix
        if why and why.fix and not isinstance(why, download.HubUnreachable)
        else "connect this machine to the network (or unset HF_HUB_OFFLINE), or copy the snapshot into HF_CACHE",
    )


# For each path: the nearest folder that exists must be writable (what a copy or download creates goes there).
WRITABLE_SCRIPT = 'for p in "$@"; do while [ ! -e "$p" ]; do p=$(dirname "$p"); done; [ -w "$p" ] || echo "$p"; done'


def check_cache_writable(ctx: Context, node: Node) -> Check:
    """Where the download (head) or the copy (worker) writes, this user may write: a cache a container created as
    root is the usual reason it may not."""
    at = where(node)
    folder = head_checkpoint_dir(ctx.settings)
    if folder is None:
        return Check("cache", at, OK, "nothing to copy there")
    if node.is_local:
        if os.path.isdir(folder) and not download.incomplete_files(folder):
            return Check("cache", at, OK, f"{folder} is complete here: the download writes nothing")
        repo: str | None = os.path.dirname(os.path.dirname(folder))
    else:
        repo = hf_repo_of(folder)
    paths = [folder] if repo is None else [os.path.join(repo, "blobs"), folder, os.path.join(repo, "refs")]
    result = node.run(["sh", "-c", WRITABLE_SCRIPT, "writable", *paths], timeout_s=30)
    if not result.ok:
        return Check(
            "cache", at, FAIL, f"cannot check {folder} there: {result.last_error_line()}", node.fix_for(result)
        )
    locked = list(dict.fromkeys(result.stdout.split()))
    if locked:
        return Check(
            "cache",
            at,
            FAIL,
            f"this user cannot write {', '.join(locked)}",
            f"a container may have left it owned by root: sudo chown -R $USER {locked[0]}"
            f"{' (on this machine)' if node.is_local else ' on ' + node.name}",
        )
    return Check("cache", at, OK, f"{repo or folder} can be written")


def check_copy(ctx: Context, worker: Node) -> Check:
    folder = head_checkpoint_dir(ctx.settings)
    if folder is None:
        return Check("checkpoint", worker.name, OK, "every rank makes the demo checkpoint itself")
    try:
        head, theirs = read_manifest(ctx.head, folder), read_manifest(worker, folder)
    except RecipeError as error:
        return Check("checkpoint", worker.name, FAIL, error.message, error.fix)
    if head and head == theirs:
        return Check("checkpoint", worker.name, OK, f"{len(head)} files, identical to the head's")
    if not theirs:
        return Check("checkpoint", worker.name, WARN, f"{folder} is not there yet", "start copies it (or sparks copy)")
    shown = "; ".join(differences(head, theirs, limit=3))
    return Check(
        "checkpoint",
        worker.name,
        WARN,
        f"its copy differs from the head's: {shown}",
        "sparks copy repairs it (only what differs is sent)",
    )
