"""The pinned checkpoint on the head, fetched once from the Hugging Face Hub into HF_CACHE.

The Hub is asked first which files of the pinned revision the cache lacks (huggingface_hub's dry run: one listing,
then a look at each file): only those bytes count toward the disk check, and only those are fetched, with
progress. When the Hub cannot be asked (HF_HUB_OFFLINE=1, no network, the Hub down), a complete cached snapshot
is used as it is and the caller is told so; an incomplete one is refused naming what is missing. Nothing here
prints: progress goes to a callback.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

from recipe.checkpoint.checkpoint import CheckpointError, head_checkpoint_dir
from recipe.settings import Settings

GIB = 1024**3
DISK_SPARE_GIB = 5  # kept free beyond what the download needs
PROGRESS_EVERY_S = 30.0  # a progress line at each tenth of the total, and at least this often
CONNECT_TIMEOUT_S = 10
OFFLINE_VALUES = ("1", "true", "yes", "on")

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


@dataclass(frozen=True)
class Needed:
    """What the cache lacks of the pinned revision, as the Hub lists it."""

    commit: str
    files: int
    missing_files: int
    missing_bytes: int


@dataclass(frozen=True)
class Fetched:
    folder: str
    downloaded_bytes: int
    note: str  # one line for the user: what was done (or why the Hub was not asked)


class HubUnreachable(CheckpointError):
    """The Hub could not be asked (offline by setting, no network, the Hub down)."""


def wanted(settings: Settings) -> bool:
    """True when the ranks serve a snapshot of HF_CACHE (not CHECKPOINT, not the embedded default's demo)."""
    return not settings.checkpoint and head_checkpoint_dir(settings) is not None


def progress_line(done: int, total: int) -> str:
    share = f" ({100 * done // total}%)" if total else ""
    return f"downloaded {done / GIB:.2f} of {total / GIB:.2f} GiB{share}"


def offline_by_setting() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in OFFLINE_VALUES


def _hub_args(settings: Settings) -> dict:
    return {
        "repo_id": settings.model_id,
        "revision": settings.model_revision or None,
        "cache_dir": os.path.join(settings.hf_cache, "hub"),
        "token": settings.hf_token or None,
        "endpoint": os.environ.get("HF_ENDPOINT") or None,
    }


def needed(settings: Settings) -> Needed:
    """Ask the Hub which files of the pinned revision are not in the cache yet (nothing is downloaded)."""
    from huggingface_hub import snapshot_download

    if offline_by_setting():
        raise HubUnreachable("HF_HUB_OFFLINE is set: the Hub is not asked", "unset HF_HUB_OFFLINE to download")
    _reachable(_hub_args(settings)["endpoint"])
    try:
        listed = snapshot_download(**_hub_args(settings), dry_run=True, tqdm_class=_silent_bar(lambda d, t: None))
    except Exception as error:  # huggingface_hub's errors, mapped to what the user can do
        raise _hub_error(settings, error) from None
    missing = [f for f in listed if f.will_download]
    commit = listed[0].commit_hash if listed else (settings.model_revision or "")
    return Needed(commit, len(listed), len(missing), sum(f.file_size or 0 for f in missing))


def _reachable(endpoint: str | None) -> None:
    """One connection attempt to the Hub (huggingface_hub itself retries for ~25 s before giving up)."""
    from huggingface_hub import constants

    url = urlparse(endpoint or constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise HubUnreachable(
            f"the Hub ({url.hostname}:{port}) did not answer ({error.strerror or error})",
            "check this machine's network, or set HF_HUB_OFFLINE=1 to use the cache as it is",
        ) from None


def fetch(settings: Settings, on_progress: Progress = lambda done, total: None) -> Fetched:
    """The pinned snapshot, complete, in HF_CACHE: only missing files are fetched (after a disk check counting
    only them); offline, a complete cached snapshot is used as it is."""
    try:
        need = needed(settings)
    except HubUnreachable as error:
        folder = cached_snapshot(settings)
        return Fetched(folder, 0, f"{error.message}: using the cached snapshot {folder} as it is (complete)")
    folder = snapshot_folder(settings, need.commit)
    if not need.missing_files:
        return Fetched(folder, 0, f"{settings.model_id} @ {need.commit[:8]}: all {need.files} files already here")
    check_free_disk(settings.hf_cache, need.missing_bytes)
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(
            **{**_hub_args(settings), "revision": need.commit},
            tqdm_class=_silent_bar(_throttled(on_progress, need.missing_bytes)),
        )
    except Exception as error:
        raise _hub_error(settings, error) from None
    missing = incomplete_files(folder)
    if missing:
        raise CheckpointError(
            f"the download of {settings.model_id} @ {need.commit[:8]} ended without {', '.join(missing[:3])}",
            "run it again: what arrived is kept",
        )
    return Fetched(
        folder,
        need.missing_bytes,
        f"{settings.model_id} @ {need.commit[:8]}: fetched "
        f"{need.missing_files} of {need.files} files ({need.missing_bytes / GIB:.2f} GiB)",
    )


def snapshot_folder(settings: Settings, commit: str) -> str:
    org, name = settings.model_id.split("/", 1)
    return os.path.join(settings.hf_cache, "hub", f"models--{org}--{name}", "snapshots", commit)


def cached_snapshot(settings: Settings) -> str:
    """The cached snapshot of the pinned revision, when it is complete; otherwise a CheckpointError naming what
    is missing."""
    folder = head_checkpoint_dir(settings) or ""
    revision = settings.model_revision or "main"
    if not os.path.isdir(folder):
        raise CheckpointError(
            f"{settings.model_id} @ {revision} is not in {settings.hf_cache} and the Hub cannot be asked",
            "run it once with network access (sparks download), or copy the snapshot there",
        )
    missing = incomplete_files(folder)
    if missing:
        raise CheckpointError(
            f"the cached snapshot {folder} is incomplete (missing {', '.join(missing[:3])}) and "
            "the Hub cannot be asked",
            "run the download again with network access",
        )
    return folder


def incomplete_files(folder: str) -> list[str]:
    """What the engine would miss in `folder`: config.json, and every shard a safetensors index names (links
    followed, so a link to a blob that never arrived counts as missing)."""
    missing = [] if os.path.isfile(os.path.join(folder, "config.json")) else ["config.json"]
    for index in (
        sorted(f for f in os.listdir(folder) if f.endswith(".safetensors.index.json")) if os.path.isdir(folder) else []
    ):
        try:
            with open(os.path.join(folder, index)) as handle:
                shards = sorted(set(json.load(handle).get("weight_map", {}).values()))
        except (OSError, ValueError, AttributeError):
            missing.append(f"{index} (unreadable)")
            continue
        missing += [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
    return missing


def check_free_disk(hf_cache: str, missing_bytes: int) -> None:
    path = hf_cache
    while not os.path.exists(path):
        path = os.path.dirname(path)
    free = shutil.disk_usage(path).free
    need = missing_bytes + DISK_SPARE_GIB * GIB
    if free < need:
        raise CheckpointError(
            f"only {free / GIB:.1f} GiB free under {hf_cache}; the download needs "
            f"{missing_bytes / GIB:.1f} GiB (+{DISK_SPARE_GIB} GiB spare)",
            f"free {(need - free) / GIB:.1f} GiB there, or point HF_CACHE at a larger disk",
        )


def _hub_error(settings: Settings, error: Exception) -> CheckpointError:
    from huggingface_hub.errors import (
        DryRunError,
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{settings.model_id} @ {settings.model_revision or 'main'}"
    if isinstance(error, PermissionError):
        return CheckpointError(
            f"this user cannot write {error.filename or settings.hf_cache} (permission denied)",
            f"a container may have left it owned by root: sudo chown -R $USER {settings.hf_cache}",
        )
    if isinstance(error, GatedRepoError):
        return CheckpointError(
            f"{settings.model_id} is gated and HF_TOKEN may not read it",
            f"agree to its terms on huggingface.co/{settings.model_id}, then set HF_TOKEN",
        )
    if isinstance(error, RevisionNotFoundError):
        return CheckpointError(
            f"the Hub has no revision {settings.model_revision!r} of {settings.model_id}",
            "check MODEL_REVISION (a commit of the model's repository)",
        )
    if isinstance(error, RepositoryNotFoundError):
        return CheckpointError(
            f"the Hub has no model {settings.model_id} (or HF_TOKEN may not see it)",
            "check MODEL_ID, and HF_TOKEN for a private model",
        )
    if (
        isinstance(error, (DryRunError, OfflineModeIsEnabled, LocalEntryNotFoundError, ConnectionError, TimeoutError))
        or "connect" in type(error).__name__.lower()
    ):
        cause = error.__cause__ or error
        return HubUnreachable(
            f"the Hub did not answer about {what} ({type(cause).__name__})",
            "check this machine's network, or set HF_HUB_OFFLINE=1 to use the cache as it is",
        )
    return CheckpointError(
        f"downloading {what} failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}",
        "run it again (what arrived is kept); SPARKS_DEBUG=1 shows the whole error",
    )


def _throttled(on_progress: Progress, total: int) -> Progress:
    """Pass on progress at each tenth of `total`, after PROGRESS_EVERY_S seconds without a line, and at the end."""
    last = {"t": 0.0, "tenth": -1}

    def report(done: int, _bar_total: int) -> None:
        tenth = 10 * done // total if total else 10
        now = time.monotonic()
        if done >= total or tenth > last["tenth"] or now - last["t"] >= PROGRESS_EVERY_S:
            last.update(t=now, tenth=tenth)
            on_progress(min(done, total), total)

    return report


def _silent_bar(on_bytes: Progress) -> type:
    """A tqdm class for huggingface_hub that draws nothing and hands the byte counts of its download bars to
    `on_bytes` (the files-count bar is ignored)."""
    from tqdm.std import tqdm

    class SilentBar(tqdm):
        def __init__(self, *args, **kwargs) -> None:
            kwargs.pop("name", None)
            kwargs["file"] = io.StringIO()
            kwargs["mininterval"] = 3600.0  # nothing is drawn; StringIO stays small
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            # huggingface_hub adds every file's bytes to its "Reconstructing" bar (plain HTTP and xet alike).
            if self.unit == "B" and (self.desc or "").lower().startswith("reconstruct"):
                on_bytes(int(self.n), int(self.total or 0))
            return shown

    return SilentBar
