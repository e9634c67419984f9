"""`docker save IMAGE | ssh worker docker load`, streamed through this process so the bytes sent can be reported.

Nothing is written to disk on either side but docker's own store; the worker's docker keeps only layers it lacks.
Bounded: the whole copy may take SHIP_TIMEOUT_S, and ssh's keep-alives end a connection that stops answering.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

from recipe.errors import RecipeError
from recipe.net.nodes import Node, SshNode

CHUNK = 1 << 20
REPORT_EVERY_S = 5.0
SHIP_TIMEOUT_S = 3600


class ShipError(RecipeError):
    """The image did not arrive on a worker."""


def image_bytes(head: Node, tag: str) -> int:
    """The image's size as docker reports it (what `docker save` will roughly send); 0 when unknown."""
    result = head.run(["docker", "image", "inspect", "--format", "{{.Size}}", tag], timeout_s=60)
    try:
        return int(result.stdout.strip()) if result.ok else 0
    except ValueError:
        return 0


def ship(tag: str, head: Node, worker: SshNode, note: Callable[[str], None]) -> int:
    """Stream `tag` from the head's docker into the worker's; returns the bytes sent."""
    total = image_bytes(head, tag)
    note(f"sending {tag} (~{total / 2**20:.0f} MiB) by docker save | ssh | docker load")
    # Each end as its node would run it (`_wrap`: as is here, through ssh there), piped through this process.
    with tempfile.TemporaryFile() as save_err, tempfile.TemporaryFile() as load_out:
        save = subprocess.Popen(
            head._wrap(["docker", "save", tag]), stdout=subprocess.PIPE, stderr=save_err, stdin=subprocess.DEVNULL
        )
        load = subprocess.Popen(
            worker._wrap(["docker", "load"]), stdin=subprocess.PIPE, stdout=load_out, stderr=subprocess.STDOUT
        )
        expired = threading.Event()

        def stop_both() -> None:
            expired.set()
            save.kill()
            load.kill()

        timer = threading.Timer(SHIP_TIMEOUT_S, stop_both)
        timer.daemon = True
        timer.start()
        try:
            sent, broken = _pump(save, load, total, note)
            save_code = save.wait()
            load_code = load.wait()
        finally:
            timer.cancel()
            for proc in (save, load):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if expired.is_set():
            raise ShipError(
                f"sending {tag} to {worker.name} took longer than {SHIP_TIMEOUT_S}s",
                f"check the link to {worker.name}; a start sends only to workers that still lack it",
            )
        if load_code != 0 or broken:  # first: a load that stopped reading also ends the save
            raise ShipError(
                f"docker load on {worker.name} failed after {sent / 2**20:.0f} MiB: {_last_line(load_out)}",
                f"check that {worker.name} answers (ssh {worker.target} true)"
                if load_code == 255
                else f"check docker and free disk on {worker.name} (df -h /var/lib/docker there)",
            )
        if save_code != 0:
            raise ShipError(
                f"docker save {tag} failed here: {_last_line(save_err)}",
                "check docker on this machine (docker image ls)",
            )
    note(f"{sent / 2**20:.0f} MiB sent")
    return sent


def _pump(save: subprocess.Popen, load: subprocess.Popen, total: int, note: Callable[[str], None]) -> tuple[int, bool]:
    """Copy save's stdout into load's stdin; (bytes sent, whether load stopped reading early)."""
    source, sink = save.stdout, load.stdin
    if source is None or sink is None:
        raise RuntimeError("_pump needs save's stdout and load's stdin opened as pipes (ship opens them so)")
    sent, last_report = 0, time.monotonic()
    broken = False
    while True:
        chunk = source.read(CHUNK)
        if not chunk:
            break
        try:
            sink.write(chunk)
        except BrokenPipeError:
            broken = True
            save.kill()
            break
        sent += len(chunk)
        if time.monotonic() - last_report >= REPORT_EVERY_S:
            last_report = time.monotonic()
            share = f" ({100 * sent / total:.0f} %)" if total else ""
            note(f"{sent / 2**20:.0f} MiB sent{share}")
    try:
        sink.close()
    except BrokenPipeError:
        broken = True
    return sent, broken


def _last_line(stream) -> str:
    stream.seek(0)
    lines = [line.strip() for line in stream.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
