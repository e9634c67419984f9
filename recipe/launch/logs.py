"""Rank logs: follow new lines while loading, show the last lines on failure, save them gzipped when stopping."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import time
from pathlib import Path


class LogFollower:
    """Reads the lines appended to a file since the last call (only complete lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(1 << 20)
        except OSError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        *complete, self._partial = data.split(b"\n")
        return [line.decode(errors="replace").rstrip("\r") for line in complete]


def tail(path: Path, count: int = 25) -> list[str]:
    """The last `count` lines of a log (reads at most the last 256 KiB)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - (256 << 10)))
            data = handle.read()
    except OSError:
        return []
    return [line.decode(errors="replace") for line in data.splitlines()[-count:]]


def save_log(live: Path, log_dir: Path, rank: int, keep: int, now: float | None = None) -> Path | None:
    """Copy a rank's live log to LOG_DIR/<YYYYmmdd-HHMMSS>-rank<N>.log.gz and keep the newest `keep` per rank."""
    if keep <= 0 or not live.is_file():
        return None
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    target = log_dir / f"{stamp}-rank{rank}.log.gz"
    suffix = 1
    while target.exists():  # two saves in one second keep both
        target = log_dir / f"{stamp}.{suffix}-rank{rank}.log.gz"
        suffix += 1
    with live.open("rb") as src, gzip.open(target, "wb") as dst:
        shutil.copyfileobj(src, dst)
    prune(log_dir, rank, keep)
    return target


def save_log_data(data: bytes, log_dir: Path, rank: int, keep: int) -> Path | None:
    """`save_log` for a log read from elsewhere (a worker's file, `docker logs`): the same name, gzip and rotation."""
    fd, scratch = tempfile.mkstemp(prefix=f"rank{rank}-", suffix=".log")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return save_log(Path(scratch), log_dir, rank, keep)
    finally:
        os.unlink(scratch)


def prune(log_dir: Path, rank: int, keep: int) -> None:
    saved = sorted(log_dir.glob(f"*-rank{rank}.log.gz"), key=lambda p: p.stat().st_mtime_ns)
    for old in saved[: max(0, len(saved) - keep)]:
        old.unlink(missing_ok=True)
